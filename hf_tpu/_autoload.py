"""Entry point of the ``torch.backends`` group: runs inside ``import torch``.

It must be cheap when emulation is off and must never make ``import torch`` fail, so
problems become one warning. Torch itself honours ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import os
import warnings

_TRUE = ("1", "true", "yes", "on")


def emulation_requested() -> bool:
    return os.environ.get("HF_TPU_EMULATE", "").strip().lower() in _TRUE


def install_integrations() -> None:
    """Install the workarounds for the backend's gaps, and hook the Hugging Face integrations (they attach
    when each library is imported)."""
    from . import diffusers, kernels, tp_plans, transformers, workarounds

    workarounds.install()
    for integration in (transformers, diffusers, kernels, tp_plans):
        integration.install()


def autoload() -> None:
    """Real TPU: leave the device alone, hook the integrations. ``HF_TPU_EMULATE=1``: set up the
    emulated TPU (which hooks them too). Otherwise: nothing."""
    try:
        from ._backend import real_tpu_present

        if real_tpu_present():
            if emulation_requested():
                warnings.warn(
                    "hf-tpu: HF_TPU_EMULATE=1 is set but a real TPU is present; using the real TPU.", stacklevel=2
                )
            install_integrations()
            return
        if emulation_requested():
            from . import emulator

            emulator.enable()
    except Exception as err:  # never break `import torch`
        warnings.warn(f"hf-tpu: set-up skipped: {err}", RuntimeWarning, stacklevel=2)
