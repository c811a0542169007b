"""Is a gap present on this process's TPU? A measurement by ``hf-tpu gaps`` wins over the gap table.

Measurements are kept per backend (``backend_key()``: TorchTPU, libtpu and torch versions on a chip;
the profile and chip count on the emulator) in ``$HF_TPU_CACHE/gaps/<key>.json``, or in the file
``HF_TPU_GAPS_FILE`` names.
"""

from __future__ import annotations

import json
import time
from importlib import metadata
from pathlib import Path

from hf_tpu import settings
from hf_tpu.gaps import get


def workarounds_enabled() -> bool:
    """``HF_TPU_WORKAROUNDS``: on unless ``0``."""
    return settings.get("HF_TPU_WORKAROUNDS")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def backend_key() -> str:
    """Which backend a measurement belongs to."""
    import torch

    from hf_tpu import emulator

    host = emulator.host()
    if host is not None:
        return f"emulated-{host.profile}-{host.usable}chips-hf_tpu-{_version('hf-tpu')}-torch-{torch.__version__}"
    from hf_tpu import xla_cpu

    if xla_cpu.active():
        return f"torch_tpu-{_version('torch-tpu')}-xla_cpu-{_version('lammps-jax-pjrt-cpu')}-torch-{torch.__version__}"
    return f"torch_tpu-{_version('torch-tpu')}-libtpu-{_version('libtpu')}-torch-{torch.__version__}"


def measurement_path() -> Path:
    if settings.is_set("HF_TPU_GAPS_FILE"):
        return Path(settings.get("HF_TPU_GAPS_FILE"))
    from hf_tpu.plumbing.cache import cache_root

    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in backend_key())
    return cache_root() / "gaps" / f"{safe}.json"


def load_measurement() -> dict | None:
    path = measurement_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if data.get("backend") == backend_key() else None


def save_measurement(results: dict[str, str]) -> Path:
    path = measurement_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"backend": backend_key(), "measured": time.strftime("%Y-%m-%d %H:%M:%S"), "gaps": results}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def _torch_tpu_has(name: str) -> tuple[bool, str]:
    gap = get(name)
    version = _version("torch-tpu")
    if gap.fixed_in is None:
        return True, f"known in torch_tpu {gap.evidence.split(' [')[0]}, no fix known (torch_tpu {version} here)"
    from packaging.version import Version

    if Version(version) < Version(gap.fixed_in):
        return True, f"torch_tpu {version} < {gap.fixed_in}, which fixed it"
    return False, f"fixed in torch_tpu {gap.fixed_in} (installed: {version})"


def present(name: str) -> tuple[bool, str]:
    """Whether gap ``name`` is present here, and why we think so."""
    get(name)
    measured = load_measurement()
    if measured is not None and measured["gaps"].get(name) in ("present", "fixed"):
        result = measured["gaps"][name]
        return result == "present", f"hf-tpu gaps measured it {result} on {measured['measured']}"
    from hf_tpu import emulator, xla_cpu

    if xla_cpu.active() and get(name).hidden_on_xla_cpu:
        return False, f"the real wheel on XLA:CPU cannot show it ({get(name).hidden_on_xla_cpu})"
    if emulator.is_enabled():
        reproduced = name in emulator.reproduced_gaps()
        profile = emulator.profile()
        return reproduced, f"the emulator's {profile} profile {'reproduces' if reproduced else 'does not have'} it"
    if get(name).component != "torch_tpu":
        return True, f"{get(name).component}'s own code ({get(name).evidence})"
    return _torch_tpu_has(name)
