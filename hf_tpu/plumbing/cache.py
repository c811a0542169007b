"""hf-tpu's cache directory, and the lock its compiled parts are built under.

Two things are compiled on first use and kept per environment: the emulator's C++ core and the PJRT shim of the
real wheel on XLA:CPU. Both build under an exclusive ``flock`` that the kernel releases when the builder dies (a
killed build never blocks the next one); a process that waits says who holds the lock and gives up after
``HF_TPU_BUILD_TIMEOUT`` seconds. Nothing here imports torch: the shim is built before torch is imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path

from hf_tpu import settings


def cache_root() -> Path:
    """``$HF_TPU_CACHE``, else ``$XDG_CACHE_HOME/hf-tpu``, else ``~/.cache/hf-tpu``."""
    root = settings.text("HF_TPU_CACHE") or os.path.join(
        settings.text("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hf-tpu"
    )
    return Path(root)


def file_digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def ensure_writable(directory: Path, what: str, error: type[Exception]) -> None:
    """Create ``directory``; raise ``error`` naming it and ``HF_TPU_CACHE`` if it cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".writable-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise error(
            f"hf-tpu: cannot use {directory} for {what} ({type(err).__name__}: {err}). Point HF_TPU_CACHE at a "
            "writable directory."
        ) from err


def build_timeout(error: type[Exception]) -> float:
    try:
        return settings.get("HF_TPU_BUILD_TIMEOUT")
    except settings.EnvError as err:
        raise error(str(err)) from None


class BuildLock:
    """An exclusive flock on ``<directory>/build.lock`` while ``what`` is built (released if its holder dies)."""

    def __init__(self, directory: Path, what: str, error: type[Exception]) -> None:
        self.path = directory / "build.lock"
        self.what = what
        self.error = error
        self.fd = -1

    def __enter__(self) -> BuildLock:
        timeout = build_timeout(self.error)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline, announced = time.monotonic() + timeout, False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise self.error(
                        f"hf-tpu: another process ({self._holder()}) has been building {self.what} for over "
                        f"{timeout:.0f} s (lock {self.path}). Wait for it, stop it, or raise HF_TPU_BUILD_TIMEOUT."
                    ) from None
                if not announced:
                    sys.stderr.write(
                        f"hf-tpu: waiting for another process ({self._holder()}) to build {self.what} "
                        f"(lock {self.path}, timeout {timeout:.0f} s)...\n"
                    )
                    announced = True
                time.sleep(0.2)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()}\n".encode())
        return self

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "pid unknown"
        except OSError:
            return "pid unknown"

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing the descriptor releases the lock
