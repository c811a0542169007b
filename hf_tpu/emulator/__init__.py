"""The emulated TPU: a CPU-backed ``"tpu"`` device that behaves like TorchTPU.

Opt in with ``HF_TPU_EMULATE=1`` (then ``import torch`` is enough) or call
:func:`enable` before the first use of the device. A real TPU always wins.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from ._build import cache_dir
from .generations import DEFAULT_GENERATION, format_bytes, get_generation, parse_bytes
from .tracking import Tracker, TransferEvent, counters, track

__all__ = [
    "Tracker",
    "TransferEvent",
    "build",
    "cache_dir",
    "counters",
    "enable",
    "is_enabled",
    "track",
]

_lock = threading.Lock()
_enabled = False


def is_enabled() -> bool:
    """Whether this process runs the emulated TPU."""
    return _enabled


def build(verbose: bool = False) -> str:
    """Compile the C++ core now (CI and images can call this ahead of time); returns the cache dir."""
    from . import _build

    _build.load(verbose=verbose)
    return str(cache_dir())


def enable(generation: str | None = None, hbm: str | int | None = None, *, quiet: bool = False) -> bool:
    """Set up the emulated ``"tpu"`` device in this process.

    Args:
        generation: TPU generation to emulate (``"v6e"`` by default, or ``HF_TPU_EMULATOR_GENERATION``).
        hbm: HBM capacity of the chip, e.g. ``"64MiB"`` (default: the generation's, or ``HF_TPU_EMULATOR_HBM``).
        quiet: do not print the one-line announcement to stderr.

    Returns:
        True if the emulator is active, False if a real TPU is present (the real TPU wins).

    Raises:
        RuntimeError: PrivateUse1 is already used by another backend, or the core cannot be built.
    """
    global _enabled
    with _lock:
        if _enabled:
            return True
        from .._backend import real_tpu_present

        if real_tpu_present():
            warnings.warn(
                "hf-tpu: a real TPU is present, so the emulated TPU stays off (the real TPU wins).",
                stacklevel=2,
            )
            return False
        import torch

        taken = torch._C._get_privateuse1_backend_name()
        if taken != "privateuseone":
            raise RuntimeError(
                f"hf-tpu: cannot emulate a TPU: the PrivateUse1 device is already registered as {taken!r} by "
                "another backend in this process. Run the emulator in a process without that backend (or unset "
                "HF_TPU_EMULATE)."
            )
        gen = get_generation(generation or os.environ.get("HF_TPU_EMULATOR_GENERATION") or DEFAULT_GENERATION)
        hbm = hbm if hbm is not None else os.environ.get("HF_TPU_EMULATOR_HBM")
        capacity = parse_bytes(hbm) if hbm is not None else gen.hbm_bytes

        from ._install import install

        install(gen, capacity)
        _enabled = True
        from .._autoload import install_integrations

        install_integrations()
        if not quiet:
            sys.stderr.write(
                f"hf-tpu: emulated TPU {gen.key} (CPU-backed), 1 chip, {format_bytes(capacity)} HBM" + "\n"
            )
        return True
