"""TorchTPU's eager executables, modelled: what ``torch.tpu._get_cache_stats()`` counts outside compiled graphs.

TorchTPU compiles one XLA executable per eager op, keyed by the op, its arguments' shapes and dtypes and its
scalar values (a greedy generate of 16 tokens with transformers' DynamicCache: 222 on the real wheel, 13.9 per
token, since every step's cache has a new length). The core (``csrc/tpu/executables.cpp``) keys each device op the
same way and counts a new key as a compilation; this module adds the persistent part: with the compile cache on
(``HF_TPU_COMPILE_CACHE``, default on) the keys outlive the process, as TorchTPU's tier-3 cache keeps its
executables, so a second process running the same code compiles nothing. Measured against the real wheel by
``bench/compile_counts.py``.
"""

from __future__ import annotations

import atexit
import os
from array import array
from pathlib import Path

from hf_tpu.emulator import _build
from hf_tpu.plumbing import compile_cache


def _file() -> Path:
    """Beside the other compile caches; one file per core build (another core, another model)."""
    path = compile_cache.emulator_executables_dir() / f"{_build.environment_key()}-{_build._sources_digest()[:12]}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def stats() -> tuple[int, int, int, int]:
    """(requests, hits, persisted hits, compilations) of eager ops in this process."""
    return tuple(_build.load().executable_stats())  # type: ignore[return-value]


def clear() -> None:
    _build.load().clear_executables()


def _load() -> list[int]:
    keys = array("Q")
    try:
        data = _file().read_bytes()
    except OSError:
        return []
    keys.frombytes(data[: len(data) - len(data) % keys.itemsize])
    return keys.tolist()


def save() -> None:
    """Merge this process's keys into the saved set (written whole, then renamed: a reader sees one or the other)."""
    core = _build.load()
    keys = set(_load()) | set(core.executable_keys())
    path = _file()
    temporary = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        temporary.write_bytes(array("Q", sorted(keys)).tobytes())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # a read-only cache: the next process compiles again, nothing breaks


def install() -> None:
    """Load the keys previous processes saved, and save this one's at exit (with the compile cache on)."""
    if not compile_cache.enabled():
        return
    _build.load().add_persisted_executables(_load())
    atexit.register(save)
