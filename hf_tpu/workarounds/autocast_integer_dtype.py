"""Gap ``autocast_integer_dtype``: ``torch.autocast("tpu", dtype=<an integer or bool dtype>)`` is an error.

TorchTPU's ``get_amp_supported_dtype()`` lists 20 dtypes, integers and bool among them, so torch's own check
lets ``torch.autocast("tpu", dtype=torch.int8)`` through and float32 matmuls then come back as int8. Autocast
is for floating dtypes (bfloat16 on a TPU): anything else raises, naming the dtype and the choices.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Patch

_FLOATING = (torch.bfloat16, torch.float16, torch.float32)


def _checked(original: Any) -> Any:
    def checked_init(self: Any, device_type: str, dtype: torch.dtype | None = None, *args: Any, **kwargs: Any) -> None:
        if device_type == "tpu" and dtype is not None and not dtype.is_floating_point:
            raise ValueError(
                f"torch.autocast('tpu', dtype={dtype}): autocast runs ops in a floating dtype; use "
                f"dtype=torch.bfloat16 (the TPU's), or one of {', '.join(map(str, _FLOATING))}."
            )
        original(self, device_type, dtype, *args, **kwargs)

    checked_init.__name__ = "__init__"
    return checked_init


_patch = Patch(torch.amp.autocast_mode.autocast, "__init__", _checked)
apply, revert = _patch.apply, _patch.revert


WORKAROUNDS = (
    Fix.workaround(
        "autocast_floating_dtypes_only",
        "autocast_integer_dtype",
        "torch.autocast (device 'tpu')",
        __doc__,
        apply,
        revert,
    ),
)
