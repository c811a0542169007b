"""Transformers on TPU: the gaps upstream leaves, each closed by one small patch (see ``patches``).

Hooks attach when transformers is imported, never before. Public helpers:
:func:`pad_to_bucket` for prompt-length bucketing with compiled decoding.
"""

from __future__ import annotations

from hf_tpu.transformers.bucketing import DEFAULT_BUCKETS, pad_to_bucket

__all__ = ["DEFAULT_BUCKETS", "install", "pad_to_bucket"]


def install() -> None:
    """Attach the patches when (or now, if) transformers' modules are imported. Idempotent."""
    from hf_tpu.transformers.patches import install as _install

    _install()
