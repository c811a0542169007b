"""Tensor parallelism on emulated chips: transformers and diffusers, hf_tpu's plan registry, failures.

Multi-process checks run in tp_worker.py under `hf-tpu launch -n N`, batched into one launch per N;
references come from the same saved models run on one chip (models.build_all). Tolerance: float32,
atol 1e-5 / rtol 1e-4 on logits and images (TP reorders the sums), greedy tokens exactly equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import run_python

HERE = Path(__file__).parent
WORKER = HERE / "tp_worker.py"
sys.path.insert(0, str(HERE))
import models  # noqa: E402

SMALL_HBM = "8MiB"  # the "big" model has ~12.6 MB of weights: too large for one chip, a quarter fits


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return models.build_all(tmp_path_factory.mktemp("tp_models"))


def launch(n: int, root: Path, *checks: str, env: dict | None = None, timeout: float = 300):
    full_env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    full_env["PYTHONPATH"] = str(HERE.parents[1])
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", str(n), str(WORKER), str(root), *checks],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ok(proc, n: int, *checks: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for check in checks:
        for rank in range(n):
            assert f"OK {check} rank={rank}" in proc.stdout, (check, rank, proc.stdout[-3000:])


CHECKS = [
    "llama", "auto_device_map", "topology_mesh", "registry_causal", "expert_parallel", "t5", "diffusers",
    "g20_device_count",
]  # fmt: skip
OKS = [
    "llama", "auto_device_map", "topology_mesh", "registry_opt", "registry_qwen3_vl", "registry_gpt_oss",
    "expert_parallel", "t5", "diffusers_sd3", "diffusers_flux", "diffusers_enable_parallelism", "g20_device_count",
]  # fmt: skip


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.long)])
def test_tp_equals_one_chip(models_dir, n):
    """TP=n logits/images/tokens equal CPU for every model; ~1/n read and allocated per chip (llama);
    at n=2 also: bfloat16 against CPU bfloat16 and compiled static-cache decoding; at n=4: a plan that does not
    divide fails before any read, and the too-large model runs."""
    extra = ["not_divisible", "oom_story"] if n == 4 else ["bf16", "compiled_decode"]
    env = {"HF_TPU_EMULATOR_HBM": SMALL_HBM} if n == 4 else {}
    proc = launch(n, models_dir, *CHECKS, *extra, env=env)
    assert_ok(proc, n, *OKS, *extra)


@pytest.mark.emulator_only("an emulated chip's HBM limit (HF_TPU_EMULATOR_HBM)")
def test_too_large_model_fails_on_one_chip_with_oom(models_dir):
    """The other half of the story: the same model and HBM on one chip raise the chip's OOM error."""
    code = f"""
        import torch
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained({str(models_dir / "big")!r}, device_map="tpu", dtype=torch.float32)
        except torch.OutOfMemoryError as err:
            print("OOM", err)
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_HBM": SMALL_HBM})
    assert "OOM TPU out of memory" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_tp_plan_auto_without_launch_says_so(models_dir, monkeypatch):
    """tp_plan_without_a_launch: upstream silently uses tp_size=1 outside a launch; on TPU it is an error naming the launcher."""
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    path = models_dir / "llama"
    with (
        pytest.warns(FutureWarning),
        pytest.raises(RuntimeError, match=r"tp_plan=.auto. without tp_size.*shard nothing.*hf-tpu launch -n N"),
    ):
        AutoModelForCausalLM.from_pretrained(path, tp_plan="auto")
    with pytest.raises(RuntimeError, match=r"tp_size=2 needs one process per TPU chip"):
        AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_size=2))
    # one chip on purpose still works
    model = AutoModelForCausalLM.from_pretrained(path, distributed_config=DistributedConfig(tp_plan="auto", tp_size=1))
    assert model.device == torch.device("tpu:0")  # upstream leaves a tp_size=1 model on the host


def test_rank_that_dies_ends_every_rank_naming_it(models_dir):
    proc = launch(2, models_dir, "die", timeout=120)  # the timeout is the bound: no hang
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    root_cause = out[out.index("Root Cause") :]
    assert "rank      : 1 (local_rank: 1)" in root_cause and "exitcode  : 3" in root_cause, root_cause


@pytest.mark.long
def test_rank_that_never_joins_fails_every_rank_naming_it(models_dir):
    proc = launch(2, models_dir, "never_join", env={"HF_TPU_JOIN_TIMEOUT": "5"}, timeout=120)  # bound: no hang
    assert proc.returncode != 0
    assert "rank(s) [1] of 2 never joined" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "waited 5 s" in proc.stdout + proc.stderr  # the stated timeout, not the default 300 s


# ---- registry, validator, derivation (one process, models on meta) ---------------------------------------
def _meta(build):
    with torch.device("meta"):
        torch.manual_seed(0)
        return build()


def test_registry_covers_the_families_upstream_ships_no_plan_for():
    from hf_tpu import tp_plans

    names = set(tp_plans.registered())
    assert {"SD3Transformer2DModel", "T5Stack", "Qwen3VLTextModel", "OPTDecoder", "GptOssModel"} <= names
    for name, build in (("opt", lambda: models._causal("opt")), ("t5", models.t5), ("sd3", models.sd3)):
        model = _meta(build)
        plan = tp_plans.plan_for(model)
        assert plan, name
        entry = next(tp_plans.get(type(m)) for m in model.modules() if tp_plans.get(type(m)) is not None)
        # every matrix is either sharded or listed as replicated on purpose
        prefixes = [p for m_name, m in model.named_modules() if tp_plans.get(type(m)) for p in (
            (f"{tp_plans.generic_name(m_name)}." if m_name else "") + r for r in tp_plans.get(type(m)).replicated
        )] + ["shared", "lm_head", "encoder.embed_tokens"]  # fmt: skip
        report = tp_plans.validate_plan(model, plan, 4, replicated_ok=prefixes)
        assert report.sharded_bytes > report.replicated_bytes, (name, entry.why)


def test_sd3_ships_no_plan_upstream_and_gets_ours():
    from diffusers import SD3Transformer2DModel

    from hf_tpu.tp_plans.diffusers import RegistryPlan

    assert isinstance(SD3Transformer2DModel._tp_plan, RegistryPlan)


def test_validator_names_the_module_and_the_number():
    from hf_tpu.tp_plans import PlanError, validate_plan

    model = _meta(lambda: models._causal("llama_kv2"))
    plan = {f"model.{k}": v for k, v in model.config.base_model_tp_plan.items()}
    validate_plan(model, plan, 2)
    with pytest.raises(PlanError, match=r"model\.layers\.\*\.self_attn: num_key_value_heads=2 .* tp_size=4"):
        validate_plan(model, plan, 4)
    with pytest.raises(PlanError, match=r"mlp\.up_proj\.weight: dim 0 of size 128 is not divisible by tp_size=3"):
        validate_plan(model, plan, 3)
    with pytest.raises(PlanError, match=r"rules \['model\.nope'\] match nothing"):
        validate_plan(model, {**plan, "model.nope": "colwise"}, 2)
    sd3 = _meta(models.sd3)
    with pytest.raises(PlanError, match=r"heads=8 is not divisible by tp_size=3"):
        validate_plan(sd3, SD3_plan(), 3)


def SD3_plan():  # noqa: N802
    from hf_tpu import tp_plans

    return tp_plans.get("SD3Transformer2DModel").plan


def test_validator_report_gives_bytes_per_chip():
    from hf_tpu.tp_plans import validate_plan

    model = _meta(lambda: models._causal("llama"))
    plan = {f"model.{k}": v for k, v in model.config.base_model_tp_plan.items()}
    report = validate_plan(model, {**plan, "model.embed_tokens": "embedding_rowwise"}, 4)
    total = sum(p.numel() * 4 for p in model.parameters())
    assert report.sharded_bytes + report.replicated_bytes == total
    assert report.bytes_per_chip(4) == report.sharded_bytes / 4 + report.replicated_bytes


def test_derive_plan_finds_upstream_llama_plan_and_our_sd3_plan():
    from hf_tpu.tp_plans import derive_plan, get

    llama = _meta(lambda: models._causal("llama"))
    derived = derive_plan(llama.model)
    upstream = {k: v for k, v in llama.config.base_model_tp_plan.items() if v in ("colwise", "rowwise")}
    assert derived.plan == upstream
    sd3 = _meta(models.sd3)
    derived = derive_plan(sd3)
    ours = {k: str.__str__(v) for k, v in get("SD3Transformer2DModel").plan.items()}
    assert derived.plan == ours
    assert derived.per_rank["transformer_blocks.*.attn"] == ("heads",)
    gpt2 = _meta(lambda: __import__("transformers").GPT2LMHeadModel(__import__("transformers").GPT2Config(n_layer=1)))
    unsure = derive_plan(gpt2).unsure
    assert "transformer.h.*.attn.c_attn" in unsure  # fused, transposed QKV: no safe proposal


def test_canonical_layout_keeps_tp_groups_and_sorts_them():
    from hf_tpu.tp_plans.transformers import canonical_layout

    layout = torch.tensor([[3, 0], [2, 1]])
    assert canonical_layout(layout).tolist() == [[0, 3], [1, 2]]
    assert canonical_layout(torch.arange(4).flip(0)).tolist() == [0, 1, 2, 3]


def test_device_map_tpu_is_the_local_chip():
    from hf_tpu.tp_plans.transformers import _local_chip_only

    assert _local_chip_only("tpu") and _local_chip_only({"": torch.device("tpu:0")}) and _local_chip_only(0)
    assert not _local_chip_only("cpu") and not _local_chip_only({"a": "tpu", "b": "cpu"}) and not _local_chip_only(1)


@pytest.mark.long
def test_sd3_pipeline_image_equals_one_chip():
    """The whole SD3 pipeline, transformer and T5 sharded over 2 chips, gives one chip's image (float32)."""
    example = HERE.parents[1] / "examples" / "diffusers_tp.py"
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    proc = subprocess.run(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", "2", str(example), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    diff = float(proc.stdout.split("max |TP - one chip| = ")[1].split()[0])
    assert diff < 1e-5, proc.stdout
