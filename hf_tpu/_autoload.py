"""Entry point of the ``torch.backends`` group: runs inside ``import torch``.

It must be cheap when emulation is off and must never make ``import torch`` fail, so
problems become one warning. Torch itself honours ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import os
import warnings


def emulation_requested() -> bool:
    """``HF_TPU_EMULATE`` as a yes/no value; anything else is an error naming it (autoload warns with it)."""
    from ._env import flag

    return flag("HF_TPU_EMULATE")


def install_integrations() -> None:
    """Install the workarounds for the backend's gaps, and hook the Hugging Face integrations (they attach
    when each library is imported)."""
    from . import _device_hints, accelerate, diffusers, fixes, kernels, tp_plans, transformers, workarounds

    workarounds.install()
    hint = fixes.Fix(
        "xla_device_names_tpu",
        "torch_xla habits",
        "aten ops on the XLA dispatch key (only while torch_xla is not installed)",
        "device='xla' says TorchTPU's device is 'tpu' instead of 'Could not run aten::empty ... XLA backend'",
        _device_hints.install_xla_hint,
    )
    fixes.install_patches([hint])
    for integration in (transformers, diffusers, accelerate, kernels, tp_plans):
        integration.install()


def autoload() -> None:
    """Real TPU: leave the device alone, hook the integrations. ``HF_TPU_EMULATE=1``: set up the
    emulated TPU (which hooks them too). Otherwise: nothing."""
    try:
        from ._backend import real_tpu_present

        if real_tpu_present():
            if os.environ.get("HF_TPU_EMULATE", "").strip() not in ("", "0"):
                warnings.warn(
                    "hf-tpu: HF_TPU_EMULATE is set but a real TPU is present; using the real TPU.", stacklevel=2
                )
            install_integrations()
            return
    except Exception as err:  # never break `import torch`
        warnings.warn(f"hf-tpu: the TPU integrations were not installed: {err}", RuntimeWarning, stacklevel=2)
        return
    try:
        if emulation_requested():
            from . import emulator

            emulator.enable()
    except Exception as err:  # never break `import torch`; the device itself will repeat the reason
        try:
            from ._device_hints import install_setup_failure

            install_setup_failure(err)
        except Exception:  # noqa: BLE001, S110  (the warning below still says what went wrong)
            pass
        warnings.warn(
            f"hf-tpu: the emulated TPU was not set up: {err} (using device 'tpu' will repeat this message)",
            RuntimeWarning,
            stacklevel=2,
        )
