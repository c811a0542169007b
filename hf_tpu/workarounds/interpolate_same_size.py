"""Gap ``interpolate_same_size``: linear interpolation of a tpu tensor to its own size is a copy.

TorchTPU aborts the process in that case. With the output size equal to the input size, linear
interpolation samples every input point exactly (align_corners or not), so the result is the input.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch


def _same_size(input: torch.Tensor, size: Any, scale_factor: Any) -> bool:  # noqa: A002
    length = input.shape[-1]
    if size is not None:
        size = size[0] if isinstance(size, (list, tuple)) and len(size) == 1 else size
        return isinstance(size, int) and size == length
    if scale_factor is not None:
        scale = scale_factor[0] if isinstance(scale_factor, (list, tuple)) and len(scale_factor) == 1 else scale_factor
        return isinstance(scale, (int, float)) and int(length * float(scale)) == length
    return False


def _wrap(interpolate: Any) -> Any:
    def interpolate_same_size_is_a_copy(
        input: torch.Tensor,
        size: Any = None,
        scale_factor: Any = None,
        mode: str = "nearest",
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:  # noqa: A002, E501
        if (
            input.device.type == "tpu"
            and mode == "linear"
            and input.dim() == 3
            and _same_size(input, size, scale_factor)
        ):
            return input.clone()
        return interpolate(input, size, scale_factor, mode, *args, **kwargs)

    interpolate_same_size_is_a_copy.__doc__ = interpolate.__doc__
    return interpolate_same_size_is_a_copy


_patch = Patch(F, "interpolate", _wrap)
apply = _patch.apply
revert = _patch.revert


WORKAROUNDS = (
    Fix.workaround(
        "interpolate_same_size_is_a_copy",
        "interpolate_same_size",
        "torch.nn.functional.interpolate",
        __doc__,
        apply,
        revert,
    ),
)
