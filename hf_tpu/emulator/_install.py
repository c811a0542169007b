"""Register the emulated device with torch, in TorchTPU's order (reference §1.6)."""

from __future__ import annotations

import sys

import torch

from . import _build, compile, distributed
from .device_module import build_module
from .generations import Generation

_MATMUL_PRECISIONS = ("medium", "high", "highest")


def install(generation: Generation, capacity: int) -> None:
    core = _build.load()
    core.route_composites_to_cpu()
    core.set_capacity(capacity)
    torch.utils.rename_privateuse1_backend("tpu")
    module = build_module(generation, capacity)
    sys.modules["torch.tpu"] = module
    torch._register_device_module("tpu", module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
    )
    torch.set_autocast_dtype("tpu", torch.bfloat16)  # TorchTPU's autocast default
    _patch_matmul_precision()
    compile.install()
    distributed.register()


def _patch_matmul_precision() -> None:
    """TorchTPU owns ``torch.{set,get}_float32_matmul_precision`` after init, default ``"medium"``.

    The value is recorded, not emulated: the CPU kernels underneath keep full fp32, and the
    CPU's own precision setting is left untouched.
    """
    state = {"precision": "medium"}

    def set_float32_matmul_precision(precision: str) -> None:
        if precision not in _MATMUL_PRECISIONS:
            raise ValueError(
                f"Invalid float32 matmul precision {precision!r}; TPU supports {', '.join(_MATMUL_PRECISIONS)}."
            )
        state["precision"] = precision

    def get_float32_matmul_precision() -> str:
        return state["precision"]

    set_float32_matmul_precision.__doc__ = torch.set_float32_matmul_precision.__doc__
    get_float32_matmul_precision.__doc__ = torch.get_float32_matmul_precision.__doc__
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    torch.get_float32_matmul_precision = get_float32_matmul_precision
