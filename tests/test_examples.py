"""The runnable examples run (they are what README and the blog show)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_transformers_generate_example_runs_on_the_emulator():
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
    assert "hf-tpu: emulated TPU v6e" in proc.stderr
