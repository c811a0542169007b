"""What runs once a TPU (real or emulated) is set up in this process.

The emulator is a device and knows nothing of the integrations: it calls :func:`device_ready`,
and ``hf_tpu/__init__`` registers the integrations (and the gap workarounds) here.
"""

from __future__ import annotations

from collections.abc import Callable

_callbacks: list[Callable[[], None]] = []


def on_device_ready(callback: Callable[[], None]) -> None:
    """Call ``callback`` (once per call of :func:`device_ready`) after the device is set up."""
    if callback not in _callbacks:
        _callbacks.append(callback)


def device_ready() -> None:
    for callback in list(_callbacks):
        callback()
