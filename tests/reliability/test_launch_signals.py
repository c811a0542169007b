"""``hf-tpu launch`` takes every rank down with it: on SIGTERM (forwarded) and when it is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

RANK = """
import os, sys, time
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pid"), "w").write(str(os.getpid()))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_rank_outlives_the_launcher(tmp_path, sig):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATOR_HOST",)}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", "2", str(script), str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait(lambda: len(list(tmp_path.glob("rank*.pid"))) == 2, 180), "the ranks never started"
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        launcher.send_signal(sig)
        launcher.wait(timeout=60)
        assert _wait(lambda: not any(_alive(pid) for pid in pids), 60), f"ranks {pids} outlived the launcher"
        if sig == signal.SIGTERM:
            assert launcher.returncode != 0 and "stopped by SIGTERM" in launcher.stderr.read()
    finally:
        launcher.kill()
