"""Entry point of the ``torch.backends`` group: runs inside ``import torch``.

It must be cheap when emulation is off and must never make ``import torch`` fail, so
problems become one warning. Torch itself honours ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from hf_tpu import settings


def emulation_requested() -> bool:
    """``HF_TPU_EMULATE`` as a yes/no value; anything else is an error naming it (autoload warns with it)."""
    return settings.get("HF_TPU_EMULATE")


def install_integrations() -> None:
    """Install the workarounds for the backend's gaps (and, on XLA:CPU, for that plugin's limits), and hook the
    Hugging Face integrations (they attach when each library is imported)."""
    from hf_tpu import accelerate, diffusers, fixes, kernels, tp_plans, transformers, workarounds, xla_cpu
    from hf_tpu.plumbing import device_hints as _device_hints

    workarounds.install()
    if xla_cpu.active():
        from hf_tpu.workarounds import xla_cpu_limits

        xla_cpu_limits.install()
    _use_compile_cache()
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
    if settings.get(
        "HF_TPU_STRICT_RECOMPILE"
    ):  # the recompile watcher raises from the first recompile, on every backend
        from hf_tpu.plumbing.import_hooks import when_imported

        when_imported("torch._dynamo", _watch_recompiles)


def _use_compile_cache() -> None:
    """TorchTPU's persistent compilation cache under hf-tpu's cache directory (a chip or XLA:CPU; the emulator sets
    up its own), before the first compilation reads the variable."""
    from hf_tpu.plumbing import compile_cache
    from hf_tpu.plumbing.backend import backend

    kind = backend()
    if kind in ("tpu", "xla_cpu"):
        compile_cache.use_torch_tpu_cache(kind)


def _watch_recompiles(_module: object) -> None:
    from hf_tpu import recompiles

    recompiles.install()


def autoload() -> None:
    """Real TPU: leave the device alone, hook the integrations. ``HF_TPU_XLA_CPU=1``: set TorchTPU's device up
    on XLA:CPU, then hook them. ``HF_TPU_EMULATE=1``: set up the emulated TPU (which hooks them too). Otherwise:
    nothing."""
    try:
        from hf_tpu import xla_cpu
        from hf_tpu.plumbing.chips import real_tpu_present

        if real_tpu_present():
            for switch in ("HF_TPU_EMULATE", "HF_TPU_XLA_CPU"):
                if (settings.text(switch) or "0") != "0":
                    warnings.warn(
                        f"hf-tpu: {switch} is set but a real TPU is present; using the real TPU.", stacklevel=2
                    )
            install_integrations()
            return
        if xla_cpu.requested():
            _set_up(xla_cpu.load, "the real TorchTPU on XLA:CPU", "HF_TPU_XLA_CPU")
            return
    except Exception as err:  # never break `import torch`
        warnings.warn(f"hf-tpu: the TPU integrations were not installed: {err}", RuntimeWarning, stacklevel=2)
        return
    if emulation_requested_safely():
        from hf_tpu import emulator

        _set_up(emulator.enable, "the emulated TPU", "HF_TPU_EMULATE")


def emulation_requested_safely() -> bool:
    try:
        return emulation_requested()
    except Exception as err:  # a bad value: the device repeats the reason
        _report_failure(err, "the emulated TPU", "HF_TPU_EMULATE")
        return False


def _set_up(start: Callable[[], object], what: str, switch: str) -> None:
    """Run ``start`` (which installs the integrations once the device is up); a failure becomes one warning, and
    every later use of device ``"tpu"`` repeats it."""
    try:
        start()
    except Exception as err:  # never break `import torch`; the device itself will repeat the reason
        _report_failure(err, what, switch)
        return
    if switch == "HF_TPU_XLA_CPU":
        install_integrations()


def _report_failure(err: BaseException, what: str, switch: str) -> None:
    try:
        from hf_tpu.plumbing.device_hints import install_setup_failure

        install_setup_failure(err, what, switch)
    except Exception:  # noqa: BLE001, S110  (the warning below still says what went wrong)
        pass
    warnings.warn(
        f"hf-tpu: {what} was not set up: {err} (using device 'tpu' will repeat this message)",
        RuntimeWarning,
        stacklevel=3,
    )
