"""Compile a pipeline for the TPU the way the Diffusers TPU recipe does, and warm it up.

The denoiser (``transformer`` or ``unet``) runs once per step and dominates the time; the VAE
decoder runs once per image. Both are compiled with ``backend="tpu", fullgraph=True,
dynamic=False``: one graph per (batch, height, width), reused by every step and every image.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.recompiles import CompileReport, watch_compiles

COMPILE_KWARGS: dict[str, Any] = {"backend": "tpu", "fullgraph": True, "dynamic": False}
DENOISERS = ("transformer", "unet", "prior", "decoder")


def _denoiser(pipe: Any) -> tuple[str, torch.nn.Module]:
    for name in DENOISERS:
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            return name, module
    components = ", ".join(k for k, v in pipe.components.items() if isinstance(v, torch.nn.Module))
    raise ValueError(
        f"compile_pipeline: {type(pipe).__name__} has no denoiser named {' / '.join(DENOISERS)} "
        f"(its modules: {components}); compile the module you want with "
        "module.compile(backend='tpu', fullgraph=True, dynamic=False)."
    )


def compile_pipeline(pipe: Any, *, vae: bool = True, options: dict[str, Any] | None = None) -> list[str]:
    """Compile ``pipe``'s denoiser and (``vae=True``) its VAE decoder for the TPU, in place.

    Compilation happens on the first call; use :func:`warm_up` to pay for it before serving.
    Returns the names of the compiled modules, e.g. ``["transformer", "vae.decoder"]``.
    ``options`` are the TPU backend's (e.g. ``{"serializable": False}``). Not ``async_compile``: with it the
    first call of each compiled module only submits its compilation and raises ``AsyncCompilationSubmitted``
    (on TorchTPU and on the emulator), which a pipeline call does not expect.
    """
    kwargs = COMPILE_KWARGS | ({"options": options} if options else {})
    name, denoiser = _denoiser(pipe)
    denoiser.compile(**kwargs)
    compiled = [name]
    decoder = getattr(getattr(pipe, "vae", None), "decoder", None)
    if vae and isinstance(decoder, torch.nn.Module):
        decoder.compile(**kwargs)
        compiled.append("vae.decoder")
    return compiled


def warm_up(
    pipe: Any,
    *,
    height: int,
    width: int,
    num_inference_steps: int = 2,
    num_images_per_prompt: int = 1,
    prompt: str = "warm-up",
    **call_kwargs: Any,
) -> CompileReport:
    """Run ``pipe`` once at this size so its graphs compile now, not on a user's request.

    Graphs depend on batch, height and width (and on call arguments that change shapes, such as
    a negative prompt or ``guidance_scale`` turning classifier-free guidance on or off), not on
    the number of steps; the scheduler's eager steps do (on TorchTPU each is an executable per
    shape): ``hf_tpu.warm_up_pipeline`` warms several sizes and step counts in one call.
    Returns the report of what compiled.
    """
    with watch_compiles() as report:
        pipe(
            prompt=prompt,
            height=height,
            width=width,
            num_inference_steps=num_inference_steps,
            num_images_per_prompt=num_images_per_prompt,
            output_type="np",
            **call_kwargs,
        )
    return report
