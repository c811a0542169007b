"""The real torch-tpu wheel on XLA:CPU (``HF_TPU_XLA_CPU=1``): how it starts, in which processes, what it refuses.

These run in ``make xla-cpu``'s environment (hf-tpu with its ``xla-cpu`` extra); the rest of the suite runs there
too, on the real wheel. Each case that needs a fresh interpreter starts one (it inherits ``HF_TPU_XLA_CPU=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hf_tpu
from hf_tpu import fixes, xla_cpu
from tests.conftest import XLA_CPU

pytestmark = pytest.mark.skipif(not XLA_CPU, reason="runs in `make xla-cpu` (the real wheel's own environment)")

# TorchTPU's start-up chatter (its absl logs and prints) is stderr; what a case checks goes to stdout.
GENERATE = """
import tempfile, torch
from transformers import AutoModelForCausalLM, Qwen3Config
import hf_tpu
from hf_tpu import xla_cpu
torch.manual_seed(0)
config = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128)
path = tempfile.mkdtemp()
AutoModelForCausalLM.from_config(config).save_pretrained(path)
ids = torch.tensor([[1, 5, 9, 3, 7]])
cpu = AutoModelForCausalLM.from_pretrained(path).generate(ids, max_new_tokens=8, do_sample=False)
model = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
before = xla_cpu.compilations()[0]
tpu = model.generate(ids.to("tpu"), max_new_tokens=8, do_sample=False)
print("RESULT", hf_tpu.backend(), model.device, torch.equal(cpu, tpu.cpu()), xla_cpu.compilations()[0] - before)
"""


def python(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def result(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return next(line for line in proc.stdout.splitlines() if line.startswith("RESULT")).split()[1:]


@pytest.mark.parametrize("first", ["torch", "transformers"])
def test_generate_on_the_real_wheel_gives_cpu_tokens_whatever_the_import_order(first):
    proc = python(f"import {first}\n" + GENERATE)
    backend, device, same, compilations = result(proc)
    assert (backend, device, same) == ("xla_cpu", "tpu:0", "True")
    assert int(compilations) > 0  # TorchTPU compiles an XLA executable per eager op and shape


def test_this_process_runs_the_real_wheel():
    assert hf_tpu.backend() == "xla_cpu" and xla_cpu.active()
    assert type(torch.tpu).__module__ != "hf_tpu.emulator.device_module"  # TorchTPU's own torch.tpu
    x = torch.arange(6.0, device="tpu").reshape(2, 3)
    before = xla_cpu.compilations()[0]
    y = (x * 3 + 1).sum(0)
    assert y.cpu().tolist() == [11.0, 17.0, 23.0]
    assert xla_cpu.compilations()[0] > before


def test_child_processes_inherit_the_mode(tmp_path):
    # a subprocess of a subprocess, and a DataLoader worker started with spawn: each a fresh interpreter
    script = tmp_path / "children.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, torch
            from torch.utils.data import DataLoader, Dataset

            class Backends(Dataset):
                def __len__(self):
                    return 1
                def __getitem__(self, i):
                    import hf_tpu
                    return hf_tpu.backend()

            if __name__ == "__main__":
                worker = next(iter(DataLoader(Backends(), num_workers=1, multiprocessing_context="spawn")))
                child = subprocess.run([sys.executable, "-c", "import torch, hf_tpu; print(hf_tpu.backend())"],
                                       capture_output=True, text=True, timeout=300).stdout.split()[-1]
                print("RESULT", worker[0], child)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert result(proc) == ["xla_cpu", "xla_cpu"]


def test_without_the_variable_import_torch_still_works_and_there_is_no_device():
    proc = python(
        "import torch, hf_tpu; print('RESULT', hf_tpu.backend(), torch._C._get_privateuse1_backend_name())",
        env={"HF_TPU_XLA_CPU": "0"},
    )
    assert result(proc) == ["none", "privateuseone"]


def test_emulation_in_the_same_process_is_a_clear_error():
    both = python("import torch; torch.ones(1, device='tpu')", env={"HF_TPU_EMULATE": "1"})
    assert both.returncode != 0
    assert "HF_TPU_EMULATE=1 and HF_TPU_XLA_CPU=1 ask for two different 'tpu' devices" in both.stderr
    explicit = python("import hf_tpu.emulator as e; e.enable()")
    assert explicit.returncode == 1
    assert "HF_TPU_XLA_CPU=1 and the emulated TPU ask for two different 'tpu' devices" in explicit.stderr


def test_an_incompatible_plugin_is_an_error_naming_both_versions(tmp_path):
    # A PJRT plugin whose table says major version 1: the shim cannot forward it, and says so before TorchTPU loads.
    source = tmp_path / "plugin.c"
    source.write_text(
        "#include <stddef.h>\n"
        "static struct { size_t size; void* ext; size_t vsize; void* vext; int major, minor; void* fns[200]; } api =\n"
        "  { sizeof api, 0, 24, 0, 1, 3 };\n"
        '__attribute__((visibility("default"))) const void* GetPjrtApi(void) { return &api; }\n'
    )
    plugin = tmp_path / "libfake_pjrt.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugin), str(source)], check=True, timeout=120)
    proc = python(
        "import torch, hf_tpu; print('RESULT', hf_tpu.backend())",
        env={"HF_TPU_XLA_CPU_PLUGIN": str(plugin), "HF_TPU_CACHE": str(tmp_path / "cache")},
    )
    assert result(proc) == ["none"]  # no device, no crash
    assert f"{plugin} speaks PJRT 1.3, and torch-tpu 0.2.0 speaks PJRT 0.116" in proc.stderr
    missing = python("import torch", env={"HF_TPU_XLA_CPU_PLUGIN": str(tmp_path / "nowhere.so")})
    assert "HF_TPU_XLA_CPU_PLUGIN=" in missing.stderr and "is not a file" in missing.stderr


def test_a_corrupt_shim_is_rebuilt(tmp_path):
    env = {"HF_TPU_CACHE": str(tmp_path)}
    first = python("import torch; from hf_tpu import xla_cpu; print('RESULT', xla_cpu.describe()['shim'])", env)
    (shim,) = result(first)
    with open(shim, "r+b") as f:
        f.truncate(100)
    again = python("import torch; print('RESULT', (torch.ones(2, device='tpu') * 2).sum().item())", env)
    assert result(again) == ["4.0"]
    assert os.path.getsize(shim) > 100


def test_env_and_info_name_the_backend_and_the_xla_cpu_workarounds():
    info = subprocess.run([sys.executable, "-m", "hf_tpu", "info"], capture_output=True, text=True, timeout=300)
    assert "backend xla_cpu" in info.stdout, info.stderr[-2000:]
    env = subprocess.run([sys.executable, "-m", "hf_tpu", "env", "--json"], capture_output=True, text=True, timeout=300)
    report = json.loads(env.stdout)
    assert report["device"]["backend"] == "xla_cpu"
    assert report["device"]["xla_cpu"]["plugin_pjrt"] == "0.115"
    assert report["device"]["xla_cpu"]["torch_tpu_pjrt"] == "0.116"
    kinds = {row["name"]: (row["kind"], row["state"]) for row in report["fixes"]}
    assert kinds["scans_as_log_steps"] == ("xla_cpu_limit", "applied")
    assert kinds["attention_without_pallas"] == ("xla_cpu_limit", "applied")


def test_scans_run_as_log_steps_eager_and_compiled():
    x = torch.randn(3, 37, generator=torch.Generator().manual_seed(0))
    on_chip = x.to("tpu")
    for name in ("cumsum", "cumprod", "logcumsumexp"):
        torch.testing.assert_close(getattr(torch, name)(on_chip, 1).cpu(), getattr(torch, name)(x, 1))
    for name in ("cummax", "cummin"):
        values, indices = getattr(torch, name)(on_chip, 1)
        expected = getattr(torch, name)(x, 1)
        assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1]])
    assert torch.equal(mask.to("tpu").cumsum(-1).cpu(), mask.cumsum(-1))  # position ids: exact
    compiled = torch.compile(lambda t: t.cumsum(-1) * 2 + torch.cummax(t, 0).values.sum(), backend="tpu")
    torch.testing.assert_close(compiled(on_chip).cpu(), x.cumsum(-1) * 2 + torch.cummax(x, 0).values.sum())


def test_without_the_scan_workaround_xla_cpu_aborts():
    # What the workaround closes: XLA:CPU dies on TorchTPU's HLO scan (a limit of the plugin, not of a chip).
    proc = python(
        """
        import torch
        from hf_tpu import fixes
        with fixes.disabled("scans_as_log_steps"):
            torch.arange(5, device="tpu").cumsum(0).cpu()
        """
    )
    assert proc.returncode == -6 and "Check failed" in proc.stderr, proc.stderr[-2000:]
    assert fixes.get("scans_as_log_steps").state == "applied"
