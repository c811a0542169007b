"""Gap ``autocast_default_float16``: ``torch.autocast("tpu")`` without a dtype computes in bfloat16.

TorchTPU's device module says its autocast dtype is bfloat16, but torch's autocast reads its own per-device
default, which TorchTPU never sets (float16 for a PrivateUse1 device). TPUs compute bfloat16 natively; float16
loses range (overflows to inf beyond 65504) for nothing. The workaround sets torch's default for the device to
bfloat16; an explicit ``dtype=`` is unchanged.
"""

from __future__ import annotations

import torch

from hf_tpu.fixes import Fix


def apply() -> None:
    torch.set_autocast_dtype("tpu", torch.bfloat16)


def revert() -> None:
    torch.set_autocast_dtype("tpu", torch.float16)


WORKAROUNDS = (
    Fix.workaround(
        "autocast_defaults_to_bfloat16",
        "autocast_default_float16",
        "torch's autocast dtype for device 'tpu'",
        __doc__,
        apply,
        revert,
    ),
)
