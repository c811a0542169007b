"""One small patch per upstream gap, named for what it fixes, applied on import.

Each patch checks that the device is a TPU before changing anything, so CPU/CUDA users of
the same process see upstream behaviour. Each has a test in tests/diffusers that fails without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hf_tpu.fixes import Fix, install_patches
from hf_tpu.plumbing.backend import on_tpu


# ---- device_map_tpu_unknown_at_import: DiffusionPipeline.from_pretrained(device_map="tpu" | "tpu:0") -------------------
def pipeline_device_map_tpu(module: ModuleType) -> None:
    """diffusers.pipelines.pipeline_utils: ``SUPPORTED_DEVICE_MAP`` is frozen when diffusers is
    imported; add the TPU names when the TPU came up later (or ``"tpu:0"`` was asked for)."""
    if not on_tpu():
        return
    for name in ("tpu", "tpu:0"):
        if name not in module.SUPPORTED_DEVICE_MAP:
            module.SUPPORTED_DEVICE_MAP.append(name)


# ---- device_backend_names_hidden: TorchDeviceBackend calls torch.tpu's internal APIs ------------------------------
# torch.tpu.<name> raises when called from outside torch/torch_tpu ("internal API"); diffusers'
# device proxy calls them for synchronize, device_count and group offloading's streams.
_THROUGH_ACCELERATOR: dict[str, Callable[..., Any]] = {
    "synchronize": lambda self, device=None: torch.accelerator.synchronize(device),
    "device_count": lambda self: torch.accelerator.device_count(),
    "is_available": lambda self: torch.accelerator.is_available(),
    "current_device": lambda self: torch.accelerator.current_device_index(),
    "set_device": lambda self, device: torch.accelerator.set_device_index(device),
    "current_stream": lambda self, device=None: torch.accelerator.current_stream(device),
    "set_stream": lambda self, stream: torch.accelerator.set_stream(stream),
}


def device_backend_through_accelerator(module: ModuleType) -> None:
    """diffusers.utils.torch_utils: ``TorchDeviceBackend`` answers the names TorchTPU keeps internal
    through ``torch.accelerator`` on a TPU (other devices: the ``torch.<device>`` module, as upstream)."""
    backend_cls = module.TorchDeviceBackend
    if on_tpu():  # detection is cached: forget a "cpu" answered before the TPU came up
        backend_cls._detect_device_type.cache_clear()

    def through_accelerator(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def method(self, *args: Any, **kwargs: Any) -> Any:
            if self.device.type == "tpu":
                return fn(self, *args, **kwargs)
            return getattr(self.module, name)(*args, **kwargs)

        method.__name__ = name
        return method

    for name, fn in _THROUGH_ACCELERATOR.items():
        if name not in vars(backend_cls):  # never replace a method upstream defines
            setattr(backend_cls, name, through_accelerator(name, fn))


# ---- denoiser_inputs_recompile: a compiled denoiser sees a new view of `timesteps` every step -----------------
def _static_inputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Clone tensor arguments that are views at an offset into a larger tensor (``t`` from
    ``for t in timesteps``): TorchTPU guards input storage offsets, so each step would compile anew."""

    def detach_view(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x._base is not None and x.storage_offset() != 0:
            return x.clone()
        return x

    @functools.wraps(compiled)
    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(*map(detach_view, args), **{k: detach_view(v) for k, v in kwargs.items()})

    call.__wrapped_static_inputs__ = True  # type: ignore[attr-defined]
    return call


def static_denoiser_inputs(module: ModuleType) -> None:
    """diffusers.models.modeling_utils: ``model.compile(...)`` on a TPU clones offset views before
    they reach the graph (SD3's pipeline clones its timestep itself; SDXL, SD1.5 and others pass
    ``t`` straight from ``timesteps``)."""
    model_cls = module.ModelMixin
    original = model_cls.compile  # torch.nn.Module.compile

    @functools.wraps(original)
    def compile(self, *args: Any, **kwargs: Any) -> None:  # noqa: A001
        original(self, *args, **kwargs)
        if on_tpu() and self._compiled_call_impl is not None:
            self._compiled_call_impl = _static_inputs(self._compiled_call_impl)

    model_cls.compile = compile


PATCHES: tuple[Fix, ...] = (
    Fix.patch("device_map_tpu_unknown_at_import", "diffusers.pipelines.pipeline_utils", pipeline_device_map_tpu),
    Fix.patch("device_backend_names_hidden", "diffusers.utils.torch_utils", device_backend_through_accelerator),
    Fix.patch("denoiser_inputs_recompile", "diffusers.models.modeling_utils", static_denoiser_inputs),
)


def install() -> None:
    install_patches(PATCHES)
