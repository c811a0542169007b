"""Which TPU this process uses: a real one (TorchTPU on a chip), the real wheel on XLA:CPU, the emulator, or none.

Detection is cheap on purpose: it runs inside ``import torch`` (autoload).
"""

from __future__ import annotations

from hf_tpu.plumbing.chips import real_tpu_present


def needs_emulator() -> bool:
    """No TPU of either real kind here (no chip, and not the real wheel on XLA:CPU): the processes hf-tpu starts
    (``hf-tpu launch`` ranks, probes, ``check --run``) run on the emulated TPU."""
    from hf_tpu import xla_cpu

    return not real_tpu_present() and not xla_cpu.requested()


def backend() -> str:
    """``"tpu"`` (TorchTPU on a chip), ``"xla_cpu"`` (TorchTPU on XLA:CPU), ``"emulated"``, or ``"none"``."""
    from hf_tpu import emulator, xla_cpu

    if emulator.is_enabled():
        return "emulated"
    if xla_cpu.active():
        return "xla_cpu"
    if real_tpu_present():
        return "tpu"
    return "none"


def on_tpu(device: object = None) -> bool:
    """Is ``device`` a TPU device, or (no device) is this process's accelerator a TPU?

    Integration patches check this first, so CPU and CUDA users of the same process keep
    upstream behaviour.
    """
    import torch

    if device is not None:
        try:
            return torch.device(device).type == "tpu"  # type: ignore[arg-type]
        except (RuntimeError, TypeError):
            return False
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return accelerator is not None and accelerator.type == "tpu"
