"""Gap ``boolean_mask_indexing``: ``x[:, :, mask2d]`` on tpu selects with the mask.

TorchTPU's index kernel broadcasts a multi-dimensional boolean index that follows a slice instead
of selecting with it. Such an index is the same as the integer indices of its True entries
(``mask.nonzero(as_tuple=True)``), which the kernel handles; every other index passes through.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch


def _convert(index: tuple) -> tuple:
    converted: list[Any] = []
    changed = False
    for i, item in enumerate(index):
        if (
            i > 0
            and isinstance(item, torch.Tensor)
            and item.dtype in (torch.bool, torch.uint8)
            and item.dim() >= 2
            and item.device.type == "tpu"
        ):
            converted.extend(item.nonzero(as_tuple=True))
            changed = True
        else:
            converted.append(item)
    return tuple(converted) if changed else index


def _wrap(getitem: Any) -> Any:
    def __getitem__(self: torch.Tensor, index: Any) -> Any:  # noqa: N807
        # Every indexing in the process comes here (decode runs dozens per token): the common index, slices and
        # integers, costs one loop over it; the device is read only when a tensor is in the index.
        if type(index) is tuple:
            for item in index:
                if isinstance(item, torch.Tensor):
                    if self.device.type == "tpu":
                        index = _convert(index)
                    break
        return getitem(self, index)

    return __getitem__


_patch = Patch(torch.Tensor, "__getitem__", _wrap)
apply = _patch.apply
revert = _patch.revert


WORKAROUNDS = (
    Fix.workaround(
        "boolean_mask_to_indices",
        "boolean_mask_indexing",
        "torch.Tensor.__getitem__ (tpu tensors)",
        __doc__,
        apply,
        revert,
    ),
)
