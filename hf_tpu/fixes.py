"""Every fix hf-tpu applies, in one registry: what it patches, why, and whether it is applied here.

Two kinds, one record type:

- **patches** close a gap in an upstream library's TPU support (transformers, diffusers, kernels,
  accelerate; ids G1..G22 from the upstream reference). Each applies when its module is imported, and
  re-checks that the device is a TPU, so CPU/CUDA users of the same process keep upstream behaviour.
- **workarounds** close a gap of the TPU backend itself (``hf_tpu.gaps``). Each is installed only while
  the backend has the gap (what ``hf-tpu gaps`` last measured here, else the gap table), on a real and
  an emulated TPU alike; ``HF_TPU_WORKAROUNDS=0`` turns them all off.

``hf-tpu gaps`` and ``hf-tpu env`` print :func:`report`.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass
class Fix:
    """One patch or workaround, and what became of it in this process."""

    name: str  # snake_case, what it does
    gap: str  # upstream gap id (G2...) or a backend gap name (hf_tpu.gaps)
    target: str  # what it changes
    why: str
    apply: Callable[..., Any]  # apply(module) when `module` is set, else apply()
    kind: str = "patch"  # "patch" | "workaround"
    module: str | None = None  # applied when this module is imported
    revert: Callable[[], None] | None = None
    state: str = field(default="not installed")
    detail: str = ""  # why it was applied or skipped

    @classmethod
    def patch(cls, gap: str, module: str, fn: Callable[[ModuleType], None]) -> Fix:
        """An upstream patch: ``fn(module)`` runs when ``module`` is imported; its docstring says what and why."""
        doc = " ".join((fn.__doc__ or "").split())
        head, sep, rest = doc.partition(": ")
        why = rest if sep and " " not in head else doc  # docstrings may start with "module.name: "
        return cls(fn.__name__, gap, module, why, fn, kind="patch", module=module)

    def as_dict(self) -> dict[str, str]:
        return {k: str(getattr(self, k) or "") for k in ("name", "kind", "gap", "target", "why", "state", "detail")}


_lock = threading.RLock()
_fixes: dict[str, Fix] = {}


def register(fixes: Iterable[Fix]) -> None:
    """Add fixes to the registry (the first record of a name wins)."""
    with _lock:
        for fix in fixes:
            _fixes.setdefault(fix.name, fix)


def get(name: str) -> Fix:
    try:
        return _fixes[name]
    except KeyError:
        raise KeyError(f"no fix named {name!r}; registered: {', '.join(sorted(_fixes))}") from None


def registered() -> list[Fix]:
    with _lock:
        return list(_fixes.values())


def report() -> list[dict[str, str]]:
    """One row per fix: name, kind, gap, target, why, state."""
    return [fix.as_dict() for fix in registered()]


def _run(fix: Fix, module: ModuleType | None) -> None:
    try:
        fix.apply(module) if fix.module else fix.apply()
    except Exception as err:  # noqa: BLE001  (an upstream change must not break the user's import)
        fix.state = f"failed: {type(err).__name__}: {err}"
        warnings.warn(
            f"hf-tpu: fix {fix.name!r} ({fix.gap}) could not be applied to {fix.target}: {err}. The gap it closes "
            "stays open; please report this with `hf-tpu env`.",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    fix.state = "applied"


def install(fix: Fix) -> None:
    """Apply ``fix`` now, or when its module is imported. Idempotent."""
    from ._import_hooks import when_imported

    with _lock:
        if fix.state.startswith(("applied", "waiting")):
            return
        if fix.module is None:
            _run(fix, None)
            return
        fix.state = f"waiting: applied when {fix.module} is imported"
    when_imported(fix.module, lambda module: _run(fix, module) if fix.state.startswith("waiting") else None)


def install_patches(fixes: Iterable[Fix]) -> None:
    """Register and attach a table of upstream patches."""
    fixes = list(fixes)
    register(fixes)
    for fix in fixes:
        install(get(fix.name))


def skip(fix: Fix, reason: str) -> None:
    fix.state = f"skipped: {reason}"


def revert(fix: Fix) -> None:
    """Undo a fix that can be undone (backend workarounds can; tests use it through :func:`disabled`)."""
    if fix.revert is None:
        raise ValueError(f"fix {fix.name!r} cannot be reverted")
    if fix.state == "applied":
        fix.revert()
    fix.state = "reverted"


@contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Run the block with these workarounds off (the gap shows again), then put them back."""
    fixes = [get(name) for name in names]
    was_applied = [fix.state == "applied" for fix in fixes]
    for fix, applied in zip(fixes, was_applied, strict=True):
        if applied:
            revert(fix)
    try:
        yield
    finally:
        for fix, applied in zip(fixes, was_applied, strict=True):
            if applied:
                _run(fix, sys.modules.get(fix.module) if fix.module else None)
