"""Workarounds for the TPU backend's own gaps (``hf_tpu.gaps``): one module per gap, named after it.

Each module declares its registry entries next to its code (``WORKAROUNDS``, made with ``Fix.workaround``); this
package finds them, so adding a workaround touches its own module only (``attention.py`` closes three gaps of SDPA
with one wrapper). Each is installed at set-up, on a real or an emulated TPU, only while the backend has the gap:
what ``hf-tpu gaps`` last measured on this machine, else the gap table (the emulator: its profile).
``HF_TPU_WORKAROUNDS=0`` turns them all off. They sit in the registry of ``hf_tpu.fixes`` beside the upstream-library
patches; ``hf-tpu gaps --fixes`` shows both.
"""

from __future__ import annotations

import importlib
import pkgutil

from hf_tpu import fixes
from hf_tpu.fixes import Fix


def declared() -> tuple[Fix, ...]:
    """Every workaround the modules of this package declare, in the order of the gaps they close."""
    from hf_tpu.gaps import BY_NAME

    found: list[Fix] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for fix in getattr(module, "WORKAROUNDS", ()):
            if fix.gap not in BY_NAME:
                raise RuntimeError(f"{module.__name__}: workaround {fix.name!r} closes unknown gap {fix.gap!r}")
            found.append(fix)
    order = list(BY_NAME)
    return tuple(sorted(found, key=lambda fix: (order.index(fix.gap), fix.name)))


_installed = False


def install() -> None:
    """Install the workarounds whose gap this backend has (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    from hf_tpu.gaps.status import present, workarounds_enabled

    table = declared()
    fixes.register(table)
    enabled = workarounds_enabled()
    for fix in table:
        fix = fixes.get(fix.name)
        if not enabled:
            fixes.skip(fix, "HF_TPU_WORKAROUNDS=0")
            continue
        has_gap, why = present(fix.gap)
        if has_gap:
            fix.detail = f"gap present: {why}"
            fixes.install(fix)
        else:
            fixes.skip(fix, why)
