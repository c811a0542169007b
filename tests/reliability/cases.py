"""The bad-input catalogue: what a user gets wrong, and the error that must answer it.

Each case runs in a fresh interpreter on the emulated TPU (its own emulated host). ``code`` runs inside a
harness that catches what it raises and reports the device memory it leaves behind; ``argv`` instead runs
that command line. A case passes when the process ends on time, without a crash, with an error (or warning)
matching ``expect`` (it names the argument or value, and usually the fix), and with device memory back at
its starting point.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    id: str
    expect: str  # regex searched in what the process reported (the error line, or stderr)
    code: str | None = None
    env: dict[str, str | None] = field(default_factory=dict)
    argv: tuple[str, ...] | None = None  # a command line instead of code (python -m ...)
    # raises: `code` raises; warns: stderr has it (code runs on); exits: argv fails cleanly; prints: argv
    # succeeds and says it on stdout
    kind: str = "raises"
    timeout: float = 120
    traceback_ok: bool = False  # torchrun prints a failed rank's traceback itself


TINY_LLAMA = """
from transformers import LlamaConfig, LlamaForCausalLM
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2)
model = LlamaForCausalLM(config).to("tpu")
"""

CASES: tuple[Case, ...] = (
    # ---- device strings and placement
    Case("device-negative-index", r"tpu:-1", "torch.ones(2, device='tpu:-1')"),
    Case("device-uppercase", r"device string: TPU", "torch.ones(2, device='TPU')"),
    Case("device-xla-habit", r"'xla' is torch_xla's.*device\('tpu'\)", "torch.ones(2, device='xla')"),
    Case(
        "device-index-out-of-range",
        r"Device index 5 is out of bounds of the number of addressable devices 1",
        "torch.ones(2, device='tpu:5')",
    ),
    Case("device-to-missing-chip", r"Device index 3", "torch.ones(2).to(torch.device('tpu', 3))"),
    Case(
        "set-device-other-chip",
        r"Device index 1 is out of bounds of the number of addressable devices 1",
        "torch.accelerator.set_device_index(1)",
    ),
    Case(
        "set-device-internal-api",
        r"internal to TorchTPU.*torch.accelerator.set_device_index",
        "torch.tpu.set_device(0)",
    ),
    Case("mixed-devices-add", r"same device.*tpu:0 and cpu", "torch.ones(3, device='tpu') + torch.ones(3)"),
    Case(
        "embedding-cpu-indices",
        r"same device.*argument index",
        "torch.nn.Embedding(8, 4).to('tpu')(torch.tensor([1, 2]))",
    ),
    Case(
        "model-fed-cpu-input-ids",
        r"same device.*tpu:0 and cpu",
        "def run():\n" + textwrap.indent(TINY_LLAMA + "model(torch.tensor([[1, 2, 3]]))", "    ") + "\nrun()",
        timeout=180,
    ),
    Case("cpu-generator-for-tpu", r"generator", "torch.randn(2, device='tpu', generator=torch.Generator())"),
    # ---- dtypes and numerics settings
    Case(
        "autocast-int8",
        r"dtype=torch.int8.*torch.bfloat16",
        "with torch.autocast('tpu', dtype=torch.int8):\n    pass",
    ),
    Case("autocast-bool", r"dtype=torch.bool", "with torch.autocast('tpu', dtype=torch.bool):\n    pass"),
    Case("matmul-precision-typo", r"mediu", "torch.set_float32_matmul_precision('mediu')"),
    Case("tpu-precision-typo", r"PrecisionConfig.*got 'fast'", "with torch.tpu.precision('fast'):\n    pass"),
    # ---- memory
    Case(
        "oom-one-huge-tensor",
        r"out of memory on tpu:0.*4.00 TiB.*HF_TPU_EMULATOR_HBM",
        "torch.empty(2**40, device='tpu')",
    ),
    Case(
        "oom-after-filling-the-chip",
        r"out of memory on tpu:0",
        "blocks = [torch.empty(2**26, device='tpu') for _ in range(100)]",
        env={"HF_TPU_EMULATOR_HBM": "1GiB"},
    ),
    Case(
        "hbm-not-a-size", r"HF_TPU_EMULATOR_HBM.*'lots'", "torch.ones(1, device='tpu')", {"HF_TPU_EMULATOR_HBM": "lots"}
    ),
    Case("hbm-zero", r"HF_TPU_EMULATOR_HBM|HBM", "torch.ones(1, device='tpu')", {"HF_TPU_EMULATOR_HBM": "0"}),
    Case(
        "hbm-beyond-host-ram",
        r"exceeds this host's RAM",
        "torch.ones(1, device='tpu')",
        {"HF_TPU_EMULATOR_HBM": "64TiB"},
        kind="warns",
    ),
    Case(
        "enable-other-hbm-after-autoload",
        r"hbm='8GiB'.*cannot take effect",
        "import hf_tpu.emulator\nhf_tpu.emulator.enable(hbm='8GiB')",
    ),
    Case(
        "enable-unknown-profile",
        r"enable\(profile='fast'\)",
        "import hf_tpu.emulator\nhf_tpu.emulator.enable(profile='fast')",
        {"HF_TPU_EMULATE": None},
    ),
    # ---- files
    Case(
        "tpu-checkpoint-without-emulator",
        r"tpu",
        "torch.load(CHECKPOINT)",
        {"HF_TPU_EMULATE": None, "PREPARE_TPU_CHECKPOINT": "1"},
    ),
    Case(
        "safetensors-missing-file",
        r"No such file|not found|does not exist",
        "from safetensors.torch import load_file\nload_file('/nonexistent/w.safetensors', device='tpu')",
    ),
    Case(
        "save-to-unwritable-path",
        r"/proc/hf-tpu-nope",
        "torch.save(torch.ones(2, device='tpu'), '/proc/hf-tpu-nope/x.pt')",
    ),
    Case(
        "from-pretrained-missing-dir",
        r"/nonexistent/model",
        "from transformers import AutoModelForCausalLM\n"
        "AutoModelForCausalLM.from_pretrained('/nonexistent/model', device_map='tpu')",
        {"HF_HUB_OFFLINE": "1"},
        timeout=180,
    ),
    # ---- compile options
    Case(
        "compile-bucket-size-wrong",
        r"`bucket_size` must be a positive integer, got 0",
        "torch.compile(lambda x: x * 2, backend='tpu', options={'bucket_size': 0})(torch.ones(2, device='tpu'))",
    ),
    Case(  # TorchTPU ignores unknown keys; hf-tpu says so, and the code runs on
        "compile-unknown-option",
        r"ignores the unknown option\(s\) \['fast'\]",
        "torch.compile(lambda x: x * 2, backend='tpu', options={'fast': True})(torch.ones(2, device='tpu'))",
        kind="warns",
    ),
    Case(
        "compile-buckets-out-of-range",
        r"num_dynamic_buckets.*between 1 and 8",
        "torch.compile(lambda x: x * 2, backend='tpu', options={'num_dynamic_buckets': 0})(torch.ones(2, device='tpu'))",
    ),
    Case(
        "compile-dynamic-true",
        r"dynamic=True",
        "torch.compile(lambda x: x * 2, backend='tpu', dynamic=True)(torch.ones(2, device='tpu'))",
    ),
    Case(
        "compile-mode",
        r"mode",
        "torch.compile(lambda x: x * 2, backend='tpu', mode='max-autotune')(torch.ones(2, device='tpu'))",
    ),
    Case(
        "compile-inductor-on-tpu",
        r"[Ii]nductor",
        "torch.compile(lambda x: x * 2, backend='inductor')(torch.ones(2, device='tpu'))",
    ),
    # ---- environment variables
    Case("emulate-not-a-flag", r"HF_TPU_EMULATE='2'.*yes/no", "torch.ones(1, device='tpu')", {"HF_TPU_EMULATE": "2"}),
    Case(
        "strict-recompile-not-a-flag",
        r"HF_TPU_STRICT_RECOMPILE='2'",
        "import hf_tpu\nhf_tpu.compile_report()",
        {"HF_TPU_STRICT_RECOMPILE": "2"},
    ),
    Case(
        "compile-fallback-unknown",
        r"HF_TPU_COMPILE_FALLBACK='eager'.*'aot_eager'",
        "torch.compile(lambda x: x * 2, backend='tpu')(torch.ones(2, device='tpu'))",
        {"HF_TPU_COMPILE_FALLBACK": "eager"},
    ),
    *(
        Case(
            f"join-timeout-{label}",
            rf"HF_TPU_JOIN_TIMEOUT='{value}'.*seconds",
            "import torch.distributed as dist\n"
            "dist.init_process_group('tpu_dist', rank=0, world_size=2, store=dist.HashStore())",
            {"HF_TPU_JOIN_TIMEOUT": value},
        )
        for label, value in (("negative", "-1"), ("zero", "0"), ("not-a-number", "abc"))
    ),
    Case(
        "generation-unknown",
        r"v99.*v6e",
        "torch.ones(1, device='tpu')",
        {"HF_TPU_EMULATOR_GENERATION": "v99"},
    ),
    Case(
        "profile-unknown",
        r"HF_TPU_EMULATOR_PROFILE.*'fast'",
        "torch.ones(1, device='tpu')",
        {"HF_TPU_EMULATOR_PROFILE": "fast"},
    ),
    Case("chips-zero", r"HF_TPU_EMULATOR_CHIPS", "torch.ones(1, device='tpu')", {"HF_TPU_EMULATOR_CHIPS": "0"}),
    Case("chips-not-a-number", r"HF_TPU_EMULATOR_CHIPS", "torch.ones(1, device='tpu')", {"HF_TPU_EMULATOR_CHIPS": "x"}),
    Case(
        "gaps-mode-unknown",
        r"HF_TPU_EMULATOR_GAPS='maybe'",
        "torch.ones(1, device='tpu')",
        {"HF_TPU_EMULATOR_GAPS": "maybe"},
    ),
    Case(
        "visible-devices-out-of-range",
        r"TPU_VISIBLE_DEVICES",
        "torch.ones(1, device='tpu')",
        {"HF_TPU_EMULATOR_CHIPS": "4", "TPU_VISIBLE_DEVICES": "9"},
    ),
    Case(
        "ragged-dot-implementation-unknown",
        r"HF_TPU_RAGGED_DOT_IMPLEMENTATION='fastest'.*grouped",
        "from hf_tpu.kernels import load_ragged_dot_kernel\n"
        "kernel = load_ragged_dot_kernel()\n"
        "kernel.choose_implementation(8, 8, 8, emulated=True, tokamax_version=None, forced='fastest')",
    ),
    # ---- launch, tensor parallel, bucketing
    Case(
        "validate-plan-tp-size-zero",
        r"tp_size=0",
        "from hf_tpu.tp_plans import validate_plan\nvalidate_plan(torch.nn.Linear(4, 4), {}, 0)",
    ),
    Case(
        "pad-to-bucket-no-buckets",
        r"buckets=\(\)",
        "from hf_tpu.transformers.bucketing import pad_to_bucket\n"
        "pad_to_bucket(torch.ones(1, 3, dtype=torch.long), buckets=())",
    ),
    Case(
        "pad-to-bucket-mask-mismatch",
        r"attention_mask has shape \(1, 2\)",
        "from hf_tpu.transformers.bucketing import pad_to_bucket\n"
        "pad_to_bucket(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))",
    ),
    Case(
        "pad-to-bucket-prompt-too-long",
        r"prompt length 40 exceeds the largest bucket 32",
        "from hf_tpu.transformers.bucketing import pad_to_bucket\n"
        "pad_to_bucket(torch.ones(1, 40, dtype=torch.long), buckets=(16, 32))",
    ),
    Case(
        "tp-plan-auto-without-launch",
        r"tp_plan=.auto. without tp_size",
        "from transformers import AutoModelForCausalLM\n"
        "AutoModelForCausalLM.from_pretrained(MODEL_DIR, tp_plan='auto')",
        {"PREPARE_MODEL_DIR": "1"},
        timeout=180,
    ),
    # ---- command line
    Case(
        "cli-launch-zero-chips",
        r"-n/--nproc must be at least 1, got 0",
        argv=("-m", "hf_tpu", "launch", "-n", "0", "x.py"),
        kind="exits",
    ),
    Case(
        "cli-launch-not-a-number",
        r"invalid int value: 'two'",
        argv=("-m", "hf_tpu", "launch", "-n", "two", "x.py"),
        kind="exits",
    ),
    Case(
        "cli-launch-missing-script",
        r"hf-tpu launch: /nonexistent/train.py on 1 chip\(s\) exited with status",
        argv=("-m", "hf_tpu", "launch", "-n", "1", "/nonexistent/train.py"),
        kind="exits",
        traceback_ok=True,
    ),
    Case("cli-gaps-unknown", r"invalid choice: 'nope'", argv=("-m", "hf_tpu", "gaps", "--show", "nope"), kind="exits"),
    Case(
        "cli-gaps-zero-chips",
        r"--chips must be at least 1",
        argv=("-m", "hf_tpu", "gaps", "--chips", "0"),
        kind="exits",
    ),
    Case(
        "cli-build-unusable-cache",
        r"cannot use /proc/hf-tpu-cache.*HF_TPU_CACHE",
        argv=("-m", "hf_tpu", "build"),
        env={"HF_TPU_CACHE": "/proc/hf-tpu-cache"},
        kind="exits",
    ),
    Case("cli-no-command", r"required: command|arguments are required", argv=("-m", "hf_tpu"), kind="exits"),
    Case(
        "build-timeout-not-a-number",
        r"HF_TPU_BUILD_TIMEOUT='soon'",
        "from hf_tpu.plumbing import cache\ncache.build_timeout(RuntimeError)",
        {"HF_TPU_BUILD_TIMEOUT": "soon"},
    ),
    # ---- torch-tpu installed on a machine without a chip (a stand-in package: the real one needs libtpu)
    Case(
        "torch-tpu-installed-no-chip-emulate",
        r"torch-tpu is installed in this environment.*cannot share a process",
        "torch.ones(1)",
        {"PYTHONPATH": "{fake_torch_tpu}"},
        kind="warns",
    ),
    Case(
        "torch-tpu-installed-no-chip-info",
        r"torch-tpu is installed but no TPU chip is attached",
        env={"PYTHONPATH": "{fake_torch_tpu}"},
        argv=("-m", "hf_tpu", "info"),
        kind="prints",
    ),
    # ---- TorchTPU's strictness, kept
    Case("internal-api-synchronize", r"torch.accelerator.synchronize", "torch.tpu.synchronize()"),
    Case(
        "cholesky-gap-off",
        r"linalg_cholesky_ex.*not implemented for TPU",
        "torch.linalg.cholesky(torch.eye(2, device='tpu'))",
        {"HF_TPU_WORKAROUNDS": "0"},
    ),
    # ---- threads
    Case(
        "oom-in-a-thread",
        r"out of memory on tpu:0",
        "import concurrent.futures\n"
        "with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
        "    pool.submit(torch.empty, 2**40, device='tpu').result()",
    ),
    Case(
        "bad-device-in-a-thread",
        r"Device index 7 is out of bounds",
        "import concurrent.futures\n"
        "with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
        "    pool.submit(torch.ones, 2, device='tpu:7').result()",
    ),
)
