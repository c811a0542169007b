"""The TPU chips of this host, found as TorchTPU finds them (PCI ids behind VFIO), and whether TorchTPU runs one.

The lowest layer of hf-tpu: it imports nothing of hf-tpu and no torch, so every layer above (the devices, the
backend, the commands) may ask it, even inside ``import torch``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys

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
    torch = sys.modules.get("torch")
    if torch is None or "torch_tpu" not in sys.modules:
        return False
    # the device layer sits above this module: look the XLA:CPU module up rather than import it (never imported:
    # this process did not point TorchTPU at XLA:CPU)
    xla_cpu = sys.modules.get("hf_tpu.xla_cpu")
    try:
        on_xla_cpu = xla_cpu is not None and xla_cpu.prepared()
        return torch._C._get_privateuse1_backend_name() == "tpu" and not on_xla_cpu
    except AttributeError:
        return False
