"""accelerate and Trainer across emulated TPU chips (patch accelerate_runs_one_process_per_host): a real distributed run, equal to one process.

Every run trains the same tiny Qwen3 for 4 steps of a global batch of 8 (`multi_chip_worker.py`): once in one
process on one chip, then on two chips with each rank given half of each batch, launched three ways
(`hf-tpu launch`, `accelerate launch`, `notebook_launcher`). Without accelerate_runs_one_process_per_host every rank ran alone on all of the data
(DistributedType.NO, world size 1): the world size, the data split and the weights below all catch that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_python

WORKER = Path(__file__).with_name("multi_chip_worker.py")
REPO = WORKER.parents[2]
SAMPLES = 32
# fp32: the two runs differ only in summation order (one batch of 8 vs two of 4 averaged over the chips);
# bf16 autocast: bfloat16 rounding of activations and gradients, measured 8e-4 (fp32 vs bf16 differ by 9e-4).
ATOL = {"no": 1e-4, "bf16": 5e-3}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    env.update(PYTHONPATH=str(REPO), **extra)
    return env


def _results(out: Path, ranks: int, proc: subprocess.CompletedProcess) -> list[dict]:
    """The ranks' result files (multi_chip_worker.report), in rank order."""
    results = [json.loads(path.read_text()) for path in sorted(out.glob("result-*.json"))]
    assert len(results) == ranks, proc.stdout[-3000:] + proc.stderr[-3000:]
    return sorted(results, key=lambda r: r["process_index"])


def _run(cmd: list[str], env: dict[str, str], ranks: int) -> list[dict]:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return _results(Path(cmd[-1]), ranks, proc)


def one_chip(kind: str, out: Path, precision: str = "no") -> list[dict]:
    env = _env(HF_TPU_EMULATE="1", MIXED_PRECISION=precision)
    return _run([sys.executable, str(WORKER), kind, str(out)], env, ranks=1)


def assert_distributed_like_one_chip(ranks: list[dict], single: list[dict], out: Path, ref: Path, precision: str):
    assert [r["world_size"] for r in ranks] == [2, 2], ranks
    halves = [set(r["seen"]) for r in ranks]
    assert all(len(h) == SAMPLES // 2 for h in halves) and not halves[0] & halves[1], halves  # each its own half
    assert halves[0] | halves[1] == set(single[0]["seen"]) == set(range(SAMPLES))
    assert ranks[0]["losses"] == ranks[1]["losses"]  # logged from the synchronised (gathered/averaged) loss
    torch.testing.assert_close(ranks[0]["losses"], single[0]["losses"], rtol=ATOL[precision], atol=0)
    got, want = load_file(out / "weights.safetensors"), load_file(ref / "weights.safetensors")
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=ATOL[precision], rtol=0, msg=name)


@pytest.fixture(scope="module")
def loop_on_one_chip(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("loop-one-chip")
    return one_chip("loop", out), out


@pytest.mark.long
def test_trainer_under_hf_tpu_launch_is_distributed_and_equals_one_process(tmp_path):
    single = one_chip("trainer", tmp_path / "one")
    assert single[0]["world_size"] == 1 and single[0]["parallel_mode"] == "ParallelMode.NOT_PARALLEL"
    cmd = [sys.executable, "-m", "hf_tpu", "launch", "-n", "2", str(WORKER), "trainer", str(tmp_path / "two")]
    ranks = _run(cmd, _env(), ranks=2)
    assert {r["parallel_mode"] for r in ranks} == {"ParallelMode.DISTRIBUTED"}
    assert {r["device"] for r in ranks} == {"tpu:0"}  # each rank owns one chip, always tpu:0 (TorchTPU)
    assert_distributed_like_one_chip(ranks, single, tmp_path / "two", tmp_path / "one", "no")


@pytest.mark.long
def test_accelerate_launch_bf16_loop_is_distributed_and_equals_one_process(tmp_path):
    single = one_chip("loop", tmp_path / "one", precision="bf16")
    env = _env(HF_TPU_EMULATE="1", HF_TPU_EMULATOR_CHIPS="2", MIXED_PRECISION="bf16")
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    ranks = _run([*accelerate, str(WORKER), "loop", str(tmp_path / "two")], env, ranks=2)
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.MULTI_TPU"}
    assert all(r["gathered"] == list(range(SAMPLES)) for r in ranks)  # accelerator.gather across the chips
    assert_distributed_like_one_chip(ranks, single, tmp_path / "two", tmp_path / "one", "bf16")


def test_notebook_launcher_trains_on_two_chips(tmp_path, loop_on_one_chip):
    """Forked children bind to their own chips at first use (as TorchTPU's runtime initialises lazily)."""
    single, ref = loop_on_one_chip
    code = f"""
        import sys
        from accelerate import notebook_launcher  # accelerate first: hf-tpu's patches wait for it to finish

        def train():
            sys.path.insert(0, {str(WORKER.parent)!r})
            import multi_chip_worker
            multi_chip_worker.report(multi_chip_worker.loop({str(tmp_path)!r}), {str(tmp_path)!r})

        notebook_launcher(train, num_processes=2)
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_CHIPS": "2", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Launching training on 2 TPUs." in proc.stdout
    ranks = _results(tmp_path, 2, proc)
    assert_distributed_like_one_chip(ranks, single, tmp_path, ref, "no")


def test_patches_apply_when_accelerate_is_imported_before_torch():
    """`import accelerate` imports torch, whose autoload installs hf-tpu while accelerate.accelerator is still
    executing: its patches must wait for the module to finish, not fail on a half-built module."""
    proc = run_python(
        """
        import accelerate
        import hf_tpu.fixes
        rows = [r for r in hf_tpu.fixes.report() if r["kind"] == "patch" and r["target"].startswith("accel")]
        print({r["name"]: r["state"] for r in rows})
        """,
        env={"HF_TPU_EMULATE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307  (our own print of a dict)
    assert states and set(states.values()) == {"applied"}, states


def test_pinned_host_memory_is_pinned():
    """DDP's unused-parameter detection (Trainer's default for a PreTrainedModel) asserts pinned host memory."""
    pinned = torch.ones(4).pin_memory()
    assert pinned.is_pinned() and not torch.ones(4).is_pinned()
    assert torch.equal(pinned.to("tpu", non_blocking=True).cpu(), torch.ones(4))
