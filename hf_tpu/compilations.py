"""XLA compilations in this process, on every backend: what a user pays before a shape is warm.

TorchTPU counts them in its executable cache (``torch.tpu._get_cache_stats()``: one per op and shape in eager
mode, one per compiled graph; a hit of its persistent cache is not a compilation). The real wheel on XLA:CPU
counts the same way, and hf-tpu's PJRT shim also times every compile there. The emulated TPU answers the same
call; it counts its compiled graphs, and models no per-op executables of eager mode (say so wherever its numbers
are shown).

    with hf_tpu.count_compilations() as paid:
        model.generate(**inputs)
    print(paid.compilations, paid.seconds)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Compilations:
    """Compilations counted while a block ran (filled in when it ends)."""

    compilations: int = 0
    seconds: float = 0.0  # spent compiling (XLA:CPU: the shim's clock; elsewhere TorchTPU's per-entry durations)
    wall_seconds: float = 0.0

    def __str__(self) -> str:
        return (
            f"{self.compilations} XLA compilation(s), {self.seconds:.2f} s compiling, {self.wall_seconds:.2f} s in all"
        )


def so_far() -> tuple[int, float]:
    """(compilations, seconds compiling) since the process started; (0, 0.0) with no TPU device."""
    import torch

    from hf_tpu import xla_cpu
    from hf_tpu.plumbing.backend import backend

    if backend() == "none":
        return 0, 0.0
    if xla_cpu.active():
        return xla_cpu.compilations()
    stats = torch.tpu._get_cache_stats()
    return int(stats.num_compilations), sum(_duration(entry) for entry in stats.per_entry_stats)


def _duration(entry: object) -> float:
    """An entry's compile time: TorchTPU's EntryStats hold a timedelta, the emulator's dicts seconds."""
    value = entry.get("compilation_duration", 0.0) if isinstance(entry, dict) else entry.compilation_duration  # type: ignore[attr-defined]
    return value.total_seconds() if hasattr(value, "total_seconds") else float(value)


@contextlib.contextmanager
def count_compilations() -> Iterator[Compilations]:
    """Count the XLA compilations of the block (on every thread of the process)."""
    result = Compilations()
    count, seconds = so_far()
    start = time.perf_counter()
    try:
        yield result
    finally:
        after_count, after_seconds = so_far()
        result.compilations = after_count - count
        result.seconds = after_seconds - seconds
        result.wall_seconds = time.perf_counter() - start
