"""The extra Python environments ``make test`` runs the suite in, each built once and cached under
``$HF_TPU_CACHE/environments/``:

- ``xla-cpu``: hf-tpu with its ``xla-cpu`` extra (the real torch-tpu wheel and XLA's CPU PJRT plugin), for ``make
  xla-cpu``. The emulator and torch-tpu cannot share an environment (both claim the "tpu" device).
- ``latest``: hf-tpu with the newest releases of its dependencies (``constraints-latest.txt``, written by
  ``scripts/latest_constraints.py``), for ``make latest``.

Each is a venv with torch pinned first (the CPU build), then this checkout installed editable, as a user would
install it. Its directory is keyed by what decides its contents (the Python, ``pyproject.toml``, ``setup.py``, the
constraints file, the start-up ``.pth``), so a change of dependencies builds a new one.

    python -m tests.environments xla-cpu      # build (or find) it and print its interpreter
"""

from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "2.13.0"
BUILD_TIMEOUT = 1800.0  # seconds: a cold pip cache downloads ~600 MB for xla-cpu (torch-tpu, libtpu, the plugin, jax)
SPECS = {
    "xla-cpu": {"extras": "xla-cpu,test", "constraints": "constraints.txt", "core": False},
    "latest": {"extras": "test", "constraints": "constraints-latest.txt", "core": True},
}


class EnvironmentBuildError(RuntimeError):
    """The environment could not be built (typically: no access to PyPI)."""


def directory(name: str) -> Path:
    from hf_tpu.plumbing.cache import cache_root

    spec = SPECS[name]
    h = hashlib.sha256(f"{name} {TORCH} {sys.version} {spec} {ROOT}".encode())  # editable: one per checkout
    for file in ("pyproject.toml", "setup.py", spec["constraints"], "hf_tpu_xla_cpu.pth"):
        h.update((ROOT / file).read_bytes())
    return cache_root() / "environments" / f"{name}-py{sys.version_info[0]}{sys.version_info[1]}-{h.hexdigest()[:12]}"


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise EnvironmentBuildError(f"{cmd[:4]} timed out after {timeout:.0f} s; log: {log}") from None
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        raise EnvironmentBuildError(f"{' '.join(cmd[:6])} failed (exit {proc.returncode}); log {log}:\n{tail}")


def build(name: str, path: Path) -> None:
    spec = SPECS[name]
    path.mkdir(parents=True, exist_ok=True)
    log = path / "build.log"
    python = path / "bin" / "python"
    _run([sys.executable, "-m", "venv", str(path)], log, 300)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, f"torch=={TORCH}"], log, BUILD_TIMEOUT)  # first and pinned: the CPU build, never CUDA
    _run([*pip, "-c", spec["constraints"], "-e", f".[{spec['extras']}]"], log, BUILD_TIMEOUT)
    if spec["core"]:  # the emulator's core, built once for this environment (as scripts/setup.sh does)
        build_core = "import hf_tpu.emulator as e; e.build()"
        _run([str(python), "-c", build_core], log, BUILD_TIMEOUT)
    (path / "ready").write_text(f"torch {TORCH}, hf-tpu[{spec['extras']}] from {ROOT} with {spec['constraints']}\n")


def ensure(name: str) -> Path:
    """The environment's directory, built first if needed (one builder at a time; others wait)."""
    path = directory(name)
    if (path / "ready").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "ready").exists():
            build(name, path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SPECS:
        sys.exit(f"usage: python -m tests.environments {{{','.join(SPECS)}}}")
    print(ensure(sys.argv[1]) / "bin" / "python")
