"""examples/moe_ragged_dot.py (the blog's snippet) runs on the emulator, offline; bench/moe_decode.py runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"} | env  # the scripts switch it on
    return subprocess.run([sys.executable, *args], env=full_env, capture_output=True, text=True, timeout=300)


def test_moe_example_runs_on_the_emulator_offline():
    proc = run([str(REPO / "examples" / "moe_ragged_dot.py"), "--max-new-tokens", "8"], HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "8 new tokens on tpu:0 with experts_implementation='tokamax_ragged_dot'" in proc.stdout
    assert "using hf-tpu's shipped ragged-dot-tpu build" in proc.stderr


@pytest.mark.long
def test_moe_decode_bench_runs():
    proc = run([str(REPO / "bench" / "moe_decode.py"), "--repeats", "1", "--layers", "1", "--batches", "8"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 8 |" in proc.stdout and "vs default" in proc.stdout
