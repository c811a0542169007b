"""A second Python environment with the real torch-tpu wheel, for the contract test (built once, then cached).

hf-tpu's emulator and torch-tpu cannot share a process (both claim the "tpu" device), so the real surface is
read in an environment of its own: a venv under ``$HF_TPU_CACHE/contract/`` with torch (pinned, the CPU build)
and torch-tpu with its dependencies, except libtpu (~140 MB): a one-function stub library exporting
``GetPjrtApi`` (pointed to by ``TPU_LIBRARY_PATH``) lets ``import torch`` finish without a chip, and
``TPU_SKIP_MDS_QUERY=1`` skips a two-minute poll of the cloud metadata server. Nothing run in it may start the
TPU runtime (it would abort without a chip).

    python -m tests.contract.environment      # build (or find) it and print its interpreter
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

TORCH_TPU = "0.2.0"
TORCH = "2.13.0"
JAX = "0.10.2"  # torch.tpu.pallas imports jax; the same version as hf-tpu's test extra
# torch-tpu 0.2.0's requirements, less libtpu (stubbed) and tensorboard (only its profiler's trace viewer).
DEPENDENCIES = ("numpy>=2", "absl-py>=2", "portpicker>=1.6", "frozendict>=2", "immutabledict>=4", "pyzmq>=27")
STUB_SOURCE = "/* libtpu stand-in: torch-tpu's import looks the PJRT entry point up; nothing calls it. */\n" \
    "void *GetPjrtApi(void) { return 0; }\n"  # fmt: skip
BUILD_TIMEOUT = 1200.0  # seconds: a cold pip cache downloads ~400 MB


class ContractEnvironmentError(RuntimeError):
    """The environment with the real wheel could not be built (typically: no access to PyPI)."""


def cache_root() -> Path:
    from hf_tpu.plumbing import cache

    return cache.cache_root() / "contract"


def directory() -> Path:
    key = hashlib.sha256(f"{TORCH_TPU} {TORCH} {JAX} {DEPENDENCIES} {sys.version}".encode()).hexdigest()[:12]
    return cache_root() / f"torch-tpu-{TORCH_TPU}-torch-{TORCH}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ContractEnvironmentError(f"{cmd[:4]} timed out after {timeout:.0f} s; log: {log}") from None
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        raise ContractEnvironmentError(f"{' '.join(cmd[:6])} failed (exit {proc.returncode}); log {log}:\n{tail}")


def build(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    log = path / "build.log"
    python = path / "bin" / "python"
    _run([sys.executable, "-m", "venv", str(path)], log, 300)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, f"torch=={TORCH}"], log, BUILD_TIMEOUT)  # first and pinned: the CPU build, never CUDA
    _run([*pip, "--no-deps", f"torch-tpu=={TORCH_TPU}"], log, BUILD_TIMEOUT)
    _run([*pip, f"jax=={JAX}", f"jaxlib=={JAX}", *DEPENDENCIES], log, BUILD_TIMEOUT)
    (path / "libtpu_stub.c").write_text(STUB_SOURCE)
    stub = path / "libtpu_stub.so"
    _run(["cc", "-shared", "-fPIC", "-O2", "-o", str(stub), str(path / "libtpu_stub.c")], log, 120)
    (path / "ready").write_text(f"torch-tpu {TORCH_TPU}, torch {TORCH}, jax {JAX}\n")


def ensure() -> Path:
    """The environment's directory, built first if needed (one builder at a time; others wait)."""
    path = directory()
    if (path / "ready").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / "ready").exists():
            build(path)
    return path


def env(path: Path) -> dict[str, str]:
    """Environment variables for a process of that interpreter: the stub libtpu, no metadata poll, no hf-tpu."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HF_TPU_", "TPU_", "PYTHON"))}
    return {**keep, "TPU_LIBRARY_PATH": str(path / "libtpu_stub.so"), "TPU_SKIP_MDS_QUERY": "1"}


if __name__ == "__main__":
    print(ensure() / "bin" / "python")
