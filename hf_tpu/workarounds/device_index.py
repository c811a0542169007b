"""Gap ``device_index``: ``Tensor.to(<int>)`` and ``Module.to(<int>)`` land on that chip.

On TorchTPU an integer device ignores its index and lands on chip 0, while ``"tpu:N"`` and
``torch.device("tpu", N)`` work; accelerate's device maps use integers, so a model spread over chips
ends up on one. The wrappers turn an integer device into ``torch.device("tpu", N)``. Installed only
where the gap can show: a process that sees more than one chip.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch


def _as_device(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.device(torch.accelerator.current_accelerator().type, value)
    return value


def _wrap(to: Any) -> Any:
    def to_with_index(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            args = (_as_device(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _as_device(kwargs["device"])
        return to(self, *args, **kwargs)

    to_with_index.__doc__ = to.__doc__
    return to_with_index


_tensor = Patch(torch.Tensor, "to", _wrap)
_module = Patch(torch.nn.Module, "to", _wrap)


def apply() -> None:
    if torch.accelerator.device_count() > 1:
        _tensor.apply()
        _module.apply()


def revert() -> None:
    _tensor.revert()
    _module.revert()


WORKAROUNDS = (
    Fix.workaround(
        "int_device_means_that_chip", "device_index", "torch.Tensor.to, torch.nn.Module.to", __doc__, apply, revert
    ),
)
