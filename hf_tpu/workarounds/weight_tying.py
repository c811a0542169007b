"""Gap ``weight_tying``: dense tpu and CPU tensors are declared shallow-copy compatible.

PyTorch swaps a tensor's storage in place (``param.data = t``, and ``Module.to()``'s fast path)
only for "shallow-copy compatible" pairs; c10 lists CPU, CUDA, XPU... and asks each PrivateUse1
backend to declare itself. TorchTPU does not, so ``Module.to("tpu")`` replaces parameters (tied
weights come back untied and twice the size) and ``param.data = tpu_tensor`` raises (diffusers'
group offloading). Dense TorchTPU tensors are plain ``c10::TensorImpl``s (the 0.2.0 wheel defines
only a sparse subclass), so the swap is what CUDA does; torch_npu declares the same.
"""

from __future__ import annotations

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Kernels

_kernels = Kernels()


def _dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type in ("cpu", "tpu") and not t.is_nested


def _compatible(self: torch.Tensor, other: torch.Tensor) -> bool:
    if _dense(self) and _dense(other):
        return True
    return self.device.type == other.device.type and self.layout == other.layout


def apply() -> None:
    _kernels.register({"_has_compatible_shallow_copy_type": _compatible})


def revert() -> None:
    _kernels.remove()


WORKAROUNDS = (
    Fix.workaround(
        "tpu_cpu_shallow_copy",
        "weight_tying",
        "aten::_has_compatible_shallow_copy_type (tpu kernel)",
        __doc__,
        apply,
        revert,
    ),
)
