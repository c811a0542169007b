"""Gap ``safetensors_device``: ``safetensors`` loads onto tpu through the host.

safetensors' own device parser knows cpu, cuda, mps, npu, xpu... but not tpu ("device tpu is
invalid"); diffusers' disk offloading calls ``load_file(path, device="tpu:0")``. Loading to CPU (a
memory map) and moving each tensor is what the library does for other devices anyway.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch


def _is_tpu(device: Any) -> bool:
    try:
        return torch.device(device).type == "tpu"
    except (RuntimeError, TypeError):
        return False


class _TpuSafeOpen:
    """``safe_open(..., device="tpu")``: the CPU handle, with tensors moved to the chip as they are read."""

    def __init__(self, original: Any, filename: Any, framework: str, device: Any, **kwargs: Any) -> None:
        self._handle = original(filename, framework=framework, device="cpu", **kwargs)
        self._device = torch.device(device)

    def __enter__(self) -> _TpuSafeOpen:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._handle.__exit__(*exc)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name).to(self._device)

    def get_slice(self, name: str) -> Any:
        handle, device = self._handle.get_slice(name), self._device

        class _Slice:
            def __getitem__(self, index: Any) -> torch.Tensor:
                return handle[index].to(device)

            def __getattr__(self, attr: str) -> Any:
                return getattr(handle, attr)

        return _Slice()

    def __getattr__(self, name: str) -> Any:  # keys(), metadata(), offset_keys()...
        return getattr(self._handle, name)


def _wrap_safe_open(safe_open: Any) -> Any:
    def tpu_aware_safe_open(filename: Any, framework: str, device: Any = "cpu", **kwargs: Any) -> Any:
        if _is_tpu(device):
            return _TpuSafeOpen(safe_open, filename, framework, device, **kwargs)
        return safe_open(filename, framework=framework, device=device, **kwargs)

    return tpu_aware_safe_open


def _wrap_load_file(load_file: Any) -> Any:
    def tpu_aware_load_file(filename: Any, device: Any = "cpu", **kwargs: Any) -> dict[str, torch.Tensor]:
        # **kwargs: newer safetensors take more keywords (backend=...); they pass through unchanged.
        if _is_tpu(device):
            return {k: v.to(device) for k, v in load_file(filename, device="cpu", **kwargs).items()}
        return load_file(filename, device=device, **kwargs)

    tpu_aware_load_file.__doc__ = load_file.__doc__
    return tpu_aware_load_file


_safe_open = Patch(None, "safe_open", _wrap_safe_open)
_torch_safe_open = Patch(None, "safe_open", _wrap_safe_open)
_load_file = Patch(None, "load_file", _wrap_load_file)


def apply(module: ModuleType) -> None:
    """Applied when ``safetensors.torch`` is imported (which imports ``safetensors`` first)."""
    import safetensors

    _safe_open.apply(safetensors)
    _torch_safe_open.apply(module)
    _load_file.apply(module)


def revert() -> None:
    for patch in (_load_file, _torch_safe_open, _safe_open):
        patch.revert()


WORKAROUNDS = (
    Fix.workaround(
        "safetensors_load_to_tpu",
        "safetensors_device",
        "safetensors.safe_open, safetensors.torch.load_file",
        __doc__,
        apply,
        revert,
        trigger="safetensors.torch",
    ),
)
