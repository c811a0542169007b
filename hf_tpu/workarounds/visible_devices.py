"""Gap ``visible_devices``: a warning, since no Python code can make TorchTPU's device count honest.

With ``TPU_VISIBLE_DEVICES`` (or ``TPU_VISIBLE_CHIPS``) a process opens only the chips listed, but
``device_count()`` still reports every chip of the host, so code that gates on the count (tests,
device maps) plans for chips it cannot use.
"""

from __future__ import annotations

import warnings

import torch

from hf_tpu import settings
from hf_tpu.fixes import Fix


def apply() -> None:
    for name in ("TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS"):
        value = settings.text(name) or ""
        if not value:
            continue
        visible = len([v for v in value.split(",") if v.strip()])
        count = torch.accelerator.device_count()
        if count > visible:
            warnings.warn(
                f"hf-tpu: {name}={value} makes {visible} chip(s) visible, but torch.accelerator.device_count() "
                f"reports {count} (TorchTPU gap 'visible_devices'): code that plans by the device count will use "
                "chips this process cannot open. Run one process per chip with `hf-tpu launch -n N` instead.",
                UserWarning,
                stacklevel=2,
            )
        return


def revert() -> None:
    """Nothing to undo: the check only warns."""


WORKAROUNDS = (
    Fix.workaround("visible_devices_warning", "visible_devices", "a warning at set-up", __doc__, apply, revert),
)
