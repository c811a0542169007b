"""The real TorchTPU on a CPU (``HF_TPU_XLA_CPU=1``): the torch-tpu wheel's own code, its programs run by XLA:CPU.

TorchTPU runs every program through a PJRT plugin: on a TPU VM, libtpu. XLA's CPU PJRT plugin speaks the same C
API, so TorchTPU's ATen kernels, lowering, executable caches, compile backend and argument checks run unchanged
on a laptop or in CI, with XLA:CPU's numerics and none of a chip's Pallas kernels. Three things make it start:

1. ``TPU_LIBRARY_PATH`` names hf-tpu's PJRT shim (``pjrt_shim.c``), which forwards to XLA's CPU plugin
   (``HF_TPU_XLA_CPU_PLUGIN``, by default the one ``pip install 'hf-tpu[xla-cpu]'`` installs) and drops the one
   TPU-only option the CPU plugin rejects;
2. TorchTPU sets its device up only when its PCI scan finds a chip: that answer becomes one chip;
3. ``TPU_SKIP_MDS_QUERY=1``: no poll of a cloud metadata server that is not there.

TorchTPU reads the first at its import, during ``import torch``, so this runs before torch: from the start-up file
``hf_tpu_xla_cpu.pth`` that hf-tpu installs (every Python process of the environment, children included, whatever
the import order), and again from torch's backend autoload when that file did not run. A real TPU always wins;
``HF_TPU_EMULATE=1`` in the same process is an error.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from hf_tpu import settings
from hf_tpu.xla_cpu.shim import Plugin, XlaCpuSetupError

__all__ = ["XlaCpuSetupError", "active", "compilations", "describe", "load", "prepare", "prepared", "requested"]

DEVICE_NAME = "TPU (XLA:CPU)"
_HARDWARE = "torch_tpu._internal.utils.hardware"
_prepared: dict[str, Any] = {}  # shim and plugin, once prepare() succeeded


def requested() -> bool:
    """``HF_TPU_XLA_CPU`` as a yes/no value (anything else is an error naming it)."""
    return settings.get("HF_TPU_XLA_CPU")


def _check_alone() -> None:
    if settings.get("HF_TPU_EMULATE"):
        raise XlaCpuSetupError(
            "hf-tpu: HF_TPU_EMULATE=1 and HF_TPU_XLA_CPU=1 ask for two different 'tpu' devices in one process (the "
            "emulated TPU, and the real torch-tpu wheel on XLA:CPU); they cannot share it. Set one of them."
        )
    if importlib.util.find_spec("torch_tpu") is None:
        raise XlaCpuSetupError(
            "hf-tpu: HF_TPU_XLA_CPU=1 runs the real torch-tpu wheel on XLA's CPU plugin, and torch-tpu is not "
            "installed here: `pip install 'hf-tpu[xla-cpu]'` (in an environment of its own: the emulator cannot "
            "share one with torch-tpu), or unset HF_TPU_XLA_CPU."
        )


def _one_chip(hardware: Any) -> None:
    """TorchTPU's chip scan (a PCI scan) answers one chip: this CPU, through the shim."""
    hardware.get_tpu_device_count = lambda: 1
    hardware.get_tpu_device_name = lambda: DEVICE_NAME


def prepare() -> bool:
    """Point TorchTPU at XLA:CPU in this process and its children (before torch is imported).

    Returns False when a real TPU is attached (it wins). Raises :class:`XlaCpuSetupError` naming what is missing.
    Safe to call again, from any thread or from inside ``import torch``: it takes no lock and imports no torch.
    """
    if _prepared:
        return True
    from hf_tpu.plumbing.chips import pci_tpu_count

    if pci_tpu_count() > 0:
        return False
    _check_alone()
    from hf_tpu.xla_cpu import shim

    found = shim.plugin()
    library = str(shim.ensure_built())
    loaded = sys.modules.get("torch_tpu")
    if loaded is not None and settings.text("TPU_LIBRARY_PATH") != library:
        raise XlaCpuSetupError(
            "hf-tpu: HF_TPU_XLA_CPU=1, but torch-tpu was imported before hf-tpu could point it at XLA:CPU (its "
            f"runtime is {settings.text('TPU_LIBRARY_PATH') or 'unset'}): the start-up file hf_tpu_xla_cpu.pth did "
            "not run in this Python. Reinstall hf-tpu into this environment (`pip install --force-reinstall "
            "--no-deps hf-tpu`), or set HF_TPU_XLA_CPU=1 before Python starts."
        )
    os.environ["TPU_LIBRARY_PATH"] = library
    os.environ["HF_TPU_XLA_CPU_PLUGIN"] = found.path
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    hardware = sys.modules.get(_HARDWARE)
    if hardware is not None:
        _one_chip(hardware)
    else:
        from hf_tpu.plumbing.import_hooks import when_imported

        when_imported(_HARDWARE, _one_chip)
    _prepared.update(shim=library, plugin=found)
    return True


def load() -> None:
    """Set TorchTPU's device up on XLA:CPU (from torch's backend autoload, whichever entry point runs first)."""
    if not prepare():
        return
    from torch_tpu import _loader

    _loader.load()
    import torch

    if torch._C._get_privateuse1_backend_name() != "tpu":
        raise XlaCpuSetupError(
            "hf-tpu: torch-tpu did not register the 'tpu' device on XLA:CPU (see its messages above)."
        )


def prepared() -> bool:
    """Whether this process pointed TorchTPU at XLA:CPU (before or during ``import torch``)."""
    return bool(_prepared)


def active() -> bool:
    """Whether this process runs the real TorchTPU on XLA:CPU."""
    if not _prepared or "torch_tpu" not in sys.modules:
        return False
    torch = sys.modules.get("torch")
    return torch is not None and torch._C._get_privateuse1_backend_name() == "tpu"


def compilations() -> tuple[int, float]:
    """(XLA compilations, seconds compiling) in this process so far: every program TorchTPU handed XLA:CPU, its
    eager per-op executables and its compiled graphs alike. (0, 0.0) when this mode is off."""
    if not _prepared:
        return 0, 0.0
    from hf_tpu.xla_cpu import shim

    try:
        return shim.counters(_prepared["shim"])
    except OSError:  # the shim is not loaded yet: nothing compiled
        return 0, 0.0


def describe() -> dict[str, str]:
    """What ``hf-tpu env`` shows about this mode."""
    from hf_tpu.xla_cpu import shim

    if not _prepared:
        return {}
    found: Plugin = _prepared["plugin"]
    framework = shim.FRAMEWORK_PJRT.get(shim._torch_tpu_version())
    count, seconds = compilations()
    return {
        "plugin": found.path,
        "plugin_pjrt": found.version_text,
        "torch_tpu_pjrt": f"{framework[0]}.{framework[1]}" if framework else "unknown",
        "shim": _prepared["shim"],
        "xla_compilations": f"{count} ({seconds:.2f} s)",
    }
