"""The runnable examples run (they are what README and the blog show)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import XLA_CPU

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_transformers_generate_example_runs_on_the_tpu():
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}  # the example switches it on itself
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "transformers_generate.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "64 new tokens on tpu:0" in proc.stdout
    if not XLA_CPU:  # the example switched the emulator on (on the real wheel's run, TorchTPU was already there)
        assert "hf-tpu: emulated TPU v6e" in proc.stderr


@pytest.mark.long
def test_diffusers_sd3_example_compiles_once_and_reuses_the_graph(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    out = tmp_path / "cat.png"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "diffusers_sd3.py"), "--steps", "3", "--size", "64", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "first (compiles):" in proc.stdout and "1 graph(s) compiled" in proc.stdout
    assert "second (reuses the graph):" in proc.stdout and "0 graph(s) compiled" in proc.stdout
    assert f"saved {out} (64x64) from tpu:0" in proc.stdout and out.stat().st_size > 0


@pytest.mark.long
def test_tp_generate_example_runs_on_two_emulated_chips():
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    proc = subprocess.run(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", "2", str(EXAMPLES / "tp_generate.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "new tokens with tp_size=2" in proc.stdout


@pytest.mark.long
def test_train_demo_learns_on_tpu_with_one_graph():
    """`make demo`: trains on tpu and on CPU from the same start; 30 steps here (the demo runs 200)."""
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_demo.py"), "--steps", "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(":")[0].strip(): line for line in proc.stdout.splitlines() if ":" in line}
    for device in ("tpu", "cpu"):
        first, last = (float(v) for v in lines[device].split("loss ")[1].split(" in ")[0].split(" -> "))
        assert last < first - 1.5, lines[device]  # 30 steps take the loss from ~5.6 to ~3
    assert "tpu compiles: 1 graph(s) for 30 training steps, 0 recompile(s)" in proc.stdout
    assert "tpu HBM: peak" in proc.stdout and "on TPU v6e" in proc.stdout
