"""Which TPU this process has: a real one (TorchTPU), the emulator, or none.

Detection is cheap on purpose: it runs inside ``import torch`` (autoload).
"""

from __future__ import annotations

import glob
import importlib.util
import os

# PCI device ids of TPU chips (vendor 0x1ae0, Google), as TorchTPU's hardware table lists them.
_TPU_PCI_IDS = frozenset({"0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def tpu_chips() -> list[tuple[str, str]]:
    """``(VFIO device file, PCI device id)`` of each TPU chip of this host, as TorchTPU finds them."""
    chips = []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if _read(os.path.join(dev, "vendor")) != "0x1ae0":
            continue
        pci_id = _read(os.path.join(dev, "device"))
        if pci_id not in _TPU_PCI_IDS:
            continue
        group = os.path.basename(os.path.realpath(os.path.join(dev, "iommu_group")))
        if os.path.exists(f"/dev/vfio/{group}"):
            chips.append((f"/dev/vfio/{group}", pci_id))
    return chips


def tpu_vfio_paths() -> list[str]:
    """The VFIO device file of each TPU chip of this host (``/dev/vfio/<group>``), as TorchTPU finds them."""
    return [path for path, _ in tpu_chips()]


def pci_tpu_count() -> int:
    """TPU chips exposed to this host through VFIO, counted the way TorchTPU counts them."""
    return len(tpu_vfio_paths())


def real_tpu_present() -> bool:
    """True when TorchTPU is installed and a TPU chip is attached (or TorchTPU already claimed "tpu" for one).

    TorchTPU on XLA:CPU (``HF_TPU_XLA_CPU=1``) claims "tpu" with no chip: that is not a real TPU.
    """
    if importlib.util.find_spec("torch_tpu") is None:
        return False
    if pci_tpu_count() > 0:
        return True
    import sys

    torch = sys.modules.get("torch")
    if torch is None or "torch_tpu" not in sys.modules:
        return False
    from . import xla_cpu

    try:
        return torch._C._get_privateuse1_backend_name() == "tpu" and not xla_cpu.prepared()
    except AttributeError:
        return False


def needs_emulator() -> bool:
    """No TPU of either real kind here (no chip, and not the real wheel on XLA:CPU): the processes hf-tpu starts
    (``hf-tpu launch`` ranks, probes, ``check --run``) run on the emulated TPU."""
    from . import xla_cpu

    return not real_tpu_present() and not xla_cpu.requested()


def backend() -> str:
    """``"tpu"`` (TorchTPU on a chip), ``"xla_cpu"`` (TorchTPU on XLA:CPU), ``"emulated"``, or ``"none"``."""
    from . import emulator, xla_cpu

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
