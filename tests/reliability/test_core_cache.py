"""The emulator core's cache: one per environment, verified before it is loaded, never blocked by a dead build."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys

import pytest

from hf_tpu.emulator import _build
from tests.conftest import run_python

pytestmark = pytest.mark.emulator_only("the emulator core's build cache")


def test_each_environment_has_its_own_core(monkeypatch):
    here = _build.environment_key()
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")
    assert _build.environment_key() != here
    assert _build.cache_dir().name == _build.environment_key()


@pytest.fixture
def cached_copy(tmp_path):
    """A copy of this environment's built core (library + manifest) in a directory of its own."""
    source = _build.cache_dir()
    for name in (_build._library(source).name, _build._MANIFEST):
        shutil.copy2(source / name, tmp_path / name)
    return tmp_path


def test_a_built_core_is_verified_before_it_loads(cached_copy):
    assert _build._verified(cached_copy) == (True, "")
    library = _build._library(cached_copy)
    with open(library, "r+b") as f:
        f.truncate(library.stat().st_size // 2)  # what a build killed while linking leaves behind
    ok, why = _build._verified(cached_copy)
    assert not ok and "truncated or corrupt" in why and str(library) in why


def test_a_corrupt_core_of_the_same_size_is_caught(cached_copy):
    library = _build._library(cached_copy)
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    assert not _build._verified(cached_copy)[0]


def _hold_lock(directory) -> subprocess.Popen:
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom hf_tpu.emulator import _build\n"
        f"with _build._BuildLock(Path({str(directory)!r})):\n    print('held', flush=True)\n    time.sleep(300)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_build_killed_midway_does_not_block_the_next(tmp_path, monkeypatch, capfd):
    holder = _hold_lock(tmp_path)
    (tmp_path / "lock").write_text("")  # cpp_extension's baton, left by the dead build
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    monkeypatch.setenv("HF_TPU_BUILD_TIMEOUT", "0.5")  # a wait would fail: the dead holder's lock is free
    with _build._BuildLock(tmp_path):
        pass
    assert "waiting for another process" not in capfd.readouterr().err


def test_waiting_for_a_live_build_times_out_naming_the_lock(tmp_path, monkeypatch, capfd):
    holder = _hold_lock(tmp_path)
    try:
        monkeypatch.setenv("HF_TPU_BUILD_TIMEOUT", "0.5")
        with pytest.raises(_build.CoreBuildError, match=rf"pid {holder.pid}.*{tmp_path}.*HF_TPU_BUILD_TIMEOUT"):
            with _build._BuildLock(tmp_path):
                pass
        assert "waiting for another process" in capfd.readouterr().err
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_cached_core_loads_without_a_compiler():
    proc = run_python(
        "import torch; print(torch.ones(2, device='tpu').sum().item())",
        env={"HF_TPU_EMULATE": "1", "PATH": "/nonexistent", "CXX": "/nonexistent/c++"},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "2.0", proc.stderr[-2000:]
