"""accelerate on TPU: patches for accelerate's own gaps (each applied when its module is imported, and only on TPU)."""

from __future__ import annotations


def install() -> None:
    """Attach the patches when (or now, if) accelerate's modules are imported. Idempotent."""
    from hf_tpu.accelerate.patches import install as _install

    _install()
