"""The TPU generations the emulator can pretend to be (the chip table: ``hf_tpu.plumbing.chips``), and HBM sizes."""

from __future__ import annotations

import re

from hf_tpu.plumbing.chips import GENERATIONS, Generation, GiB

__all__ = ["DEFAULT_GENERATION", "GENERATIONS", "Generation", "GiB", "format_bytes", "get_generation", "parse_bytes"]

DEFAULT_GENERATION = "v6e"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def get_generation(key: str) -> Generation:
    """Look up a generation by key (``"v6e"``), with an error listing the known ones."""
    try:
        return GENERATIONS[key.strip().lower()]
    except KeyError:
        raise ValueError(
            f"HF_TPU_EMULATOR_GENERATION={key!r} is not a TPU generation the emulator knows; "
            f"use one of {', '.join(GENERATIONS)}."
        ) from None


def parse_bytes(text: str | int, *, name: str = "HF_TPU_EMULATOR_HBM") -> int:
    """``"64MiB"``, ``"8GiB"``, ``"1.5GB"`` or a plain byte count, to bytes."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"{name}={text!r} is not a size; write it like '64MiB', '8GiB', '1.5GB' or a byte count.")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be a positive size.")
    return value


def format_bytes(n: int) -> str:
    """Bytes as a short human string (``32 GiB``, ``64 MiB``)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{n} B"
