"""The TPU chips: each generation's numbers (the one chip table), the chips of this host, found as TorchTPU finds
them (PCI ids behind VFIO), and whether TorchTPU runs one.

The lowest layer of hf-tpu: it imports nothing of hf-tpu and no torch, so every layer above (the devices, the
backend, the commands) may ask it, even inside ``import torch``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class Generation:
    """One TPU generation, per device as TorchTPU 0.2.0 shows it (a v7 chip is two devices of half each)."""

    key: str
    name: str
    pci_id: str  # PCI device id (vendor 0x1ae0, Google), as TorchTPU's hardware table lists it
    hbm_bytes: int
    hbm_bandwidth: float  # bytes/s
    bf16_flops: float
    devices_per_chip: int = 1


# Per chip as Google lists them (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e, /tpu7x: HBM, HBM bandwidth, peak
# bf16 FLOP/s), divided among the devices TorchTPU shows per chip; the PCI ids are TorchTPU 0.2.0's.
GENERATIONS: dict[str, Generation] = {
    g.key: g
    for g in (
        Generation("v4", "TPU v4", "0x005e", 32 * GiB, 1200e9, 275e12),
        Generation("v5e", "TPU v5e", "0x0063", 16 * GiB, 819e9, 197e12),
        Generation("v5p", "TPU v5p", "0x0062", 95 * GiB, 2765e9, 459e12),
        Generation("v6e", "TPU v6e", "0x006f", 32 * GiB, 1638e9, 918e12),
        Generation("v7", "TPU v7", "0x0076", 96 * GiB, 7370e9 / 2, 2307e12 / 2, devices_per_chip=2),
    )
}
SOURCE = "Google Cloud TPU system architecture pages (per chip: HBM, HBM bandwidth, peak bf16 FLOP/s)"
_TPU_PCI_IDS = frozenset(g.pci_id for g in GENERATIONS.values())


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
