"""Diffusers on TPU: placement, TorchTPU's strict device APIs, and the compile recipe.

Hooks attach when diffusers is imported, never before (see ``patches``). Public helpers:
:func:`compile_pipeline` compiles a pipeline's denoiser and VAE decoder with the TPU backend,
:func:`warm_up` pays for compilation at a given size before serving.
"""

from __future__ import annotations

from hf_tpu.diffusers.compile import compile_pipeline, warm_up

__all__ = ["compile_pipeline", "install", "warm_up"]


def install() -> None:
    """Attach the patches when (or now, if) diffusers' modules are imported. Idempotent."""
    from hf_tpu.diffusers.patches import install as _install

    _install()
