"""Gap ``avg_pool1d_gradient``: ``F.avg_pool1d`` on tpu runs as a 2-d pool over a unit height.

TorchTPU registers its own avg_pool1d kernel, which bypasses the composite autograd knows how to
differentiate, so the output has no grad_fn and the layers before it silently get no gradient.
avg_pool2d is differentiable on TPU; pooling a (N, C, 1, L) view with a (1, k) window is the same op.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch


def _pair(value: Any, default: int) -> int:
    value = default if value is None or (isinstance(value, (list, tuple)) and not value) else value
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _wrap(avg_pool1d: Any) -> Any:
    def avg_pool1d_through_2d(
        input: torch.Tensor,  # noqa: A002  (PyTorch's name)
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> torch.Tensor:
        if input.device.type != "tpu":
            return avg_pool1d(input, kernel_size, stride, padding, ceil_mode, count_include_pad)
        k = _pair(kernel_size, 1)
        s = _pair(stride, k)
        p = _pair(padding, 0)
        pooled = F.avg_pool2d(input.unsqueeze(-2), (1, k), (1, s), (0, p), ceil_mode, count_include_pad)
        return pooled.squeeze(-2)

    avg_pool1d_through_2d.__doc__ = avg_pool1d.__doc__
    return avg_pool1d_through_2d


_patch = Patch(F, "avg_pool1d", _wrap)
apply = _patch.apply
revert = _patch.revert


WORKAROUNDS = (
    Fix.workaround(
        "avg_pool1d_through_2d",
        "avg_pool1d_gradient",
        "torch.nn.functional.avg_pool1d (tpu tensors)",
        __doc__,
        apply,
        revert,
    ),
)
