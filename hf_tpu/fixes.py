"""Every fix hf-tpu applies, in one registry: what it patches, why, and whether it is applied here.

Three kinds, one record type:

- **patches** close a gap in an upstream library's TPU support (transformers, diffusers, kernels,
  accelerate; each names its upstream gap in words: ``max_memory_rejects_tpu_keys``, ...). Each applies when its module is imported, and
  re-checks that the device is a TPU, so CPU/CUDA users of the same process keep upstream behaviour.
- **workarounds** close a gap of the TPU backend itself (``hf_tpu.gaps``). Each is installed only while
  the backend has the gap (what ``hf-tpu gaps`` last measured here, else the gap table), on a real and
  an emulated TPU alike; ``HF_TPU_WORKAROUNDS=0`` turns them all off.
- **defaults** give a TPU the shapes it needs so that a warm process compiles nothing (``generate()`` at bucketed
  prompt lengths on a static cache, Trainer batches padded to buckets). They change how upstream runs, not what
  it computes, and each names its off switch (``off``).
- **xla_cpu_limit** workarounds close what XLA's CPU plugin cannot run (``hf_tpu.workarounds.xla_cpu_limits``):
  limits of the real wheel's CPU stand-in, not of TorchTPU, installed only with ``HF_TPU_XLA_CPU=1``.

``hf-tpu gaps`` and ``hf-tpu env`` print :func:`report`.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any


@dataclass
class Fix:
    """One patch or workaround, and what became of it in this process."""

    name: str  # snake_case, what it does
    gap: str  # upstream gap id (max_memory_rejects_tpu_keys...) or a backend gap name (hf_tpu.gaps)
    target: str  # what it changes
    why: str
    apply: Callable[..., Any]  # apply(module) when `module` is set, else apply()
    kind: str = "patch"  # "patch" | "workaround" | "default" | "xla_cpu_limit"
    module: str | None = None  # applied when this module is imported
    revert: Callable[[], None] | None = None
    state: str = field(default="not installed")
    detail: str = ""  # why it was applied or skipped
    # Where the patch goes in each version of the library (its top-level package's distribution): (version
    # specifier, module), a module of None meaning that version does the job itself. Empty: ``module`` always.
    targets: tuple[tuple[str, str | None], ...] = ()
    off: str = ""  # defaults: how a user turns it off

    @classmethod
    def default(cls, module: str, fn: Callable[[ModuleType], Callable[[], None]], *, off: str) -> Fix:
        """A TPU default: ``fn(module)`` runs when ``module`` is imported and returns the function that undoes it."""
        doc = " ".join((fn.__doc__ or "").split())
        fix = cls(fn.__name__, "compilations", module, doc, fn, kind="default", module=module, off=off)

        def apply(target: ModuleType) -> None:
            fix.revert = fn(target)

        fix.apply = apply
        return fix

    @classmethod
    def patch(
        cls, gap: str, module: str, fn: Callable[[ModuleType], None], *, targets: dict[str, str | None] | None = None
    ) -> Fix:
        """An upstream patch: ``fn(module)`` runs when ``module`` is imported; its docstring says what and why.
        ``targets`` maps version specifiers of the library (``"<0.19"``) to the module holding the target in those
        versions, or None where the library fixed the gap itself."""
        doc = " ".join((fn.__doc__ or "").split())
        head, sep, rest = doc.partition(": ")
        why = rest if sep and " " not in head else doc  # docstrings may start with "module.name: "
        fix = cls(fn.__name__, gap, module, why, fn, kind="patch", module=module)
        fix.targets = tuple((targets or {}).items())
        return fix

    @classmethod
    def workaround(
        cls,
        name: str,
        gap: str,
        target: str,
        why: str | None,
        apply: Callable[[], None],
        revert: Callable[[], None],
        *,
        trigger: str | None = None,
    ) -> Fix:
        """A workaround for backend gap ``gap`` (``hf_tpu.gaps``), declared in its module next to its code. ``why``: a
        sentence, or the module's docstring, whose first line reads "Gap ``NAME``: what the workaround does."
        ``trigger``: a module whose import applies it (else it applies at set-up)."""
        first = (why or "").strip().split("\n")[0]
        return cls(name, gap, target, first.split(": ", 1)[-1], apply, kind="workaround", module=trigger, revert=revert)

    @property
    def library(self) -> str:
        """The top-level package the patch targets (``kernels`` for ``kernels.load``)."""
        return (self.module or "").split(".")[0]

    def as_dict(self) -> dict[str, str]:
        keys = ("name", "kind", "gap", "target", "why", "state", "detail", "off")
        return {k: str(getattr(self, k) or "") for k in keys}


_lock = threading.RLock()  # re-entrant: applying a fix imports modules, whose hooks install fixes again
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


def _library_version(library: str) -> str | None:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def _resolve_target(fix: Fix) -> str | None:
    """Pick the module for the installed version (``fix.targets``); None (with the fix's state set) when the version
    needs no patch or has no known target."""
    version = _library_version(fix.library)
    if not fix.targets or version is None:
        return fix.module
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    for spec, module in fix.targets:
        if Version(version) in SpecifierSet(spec):
            if module is None:
                fix.state = f"not needed: {fix.library} {version} does it itself"
            return module
    _fail(fix, f"{fix.library} {version} is newer than the versions it knows ({', '.join(s for s, _ in fix.targets)})")
    return None


def _fail(fix: Fix, why: str) -> None:
    fix.state = f"failed: {why}"
    warnings.warn(
        f"hf-tpu: fix {fix.name!r} ({fix.gap}) could not find its target: {why}. The gap it closes stays open; "
        "please report this with `hf-tpu env`.",
        RuntimeWarning,
        stacklevel=4,
    )


def _module_exists(name: str) -> bool:
    """Whether ``name`` is a module of its (imported) top-level package, found on disk without importing it."""
    if name in sys.modules:
        return True
    top, *rest = name.split(".")
    path = getattr(sys.modules.get(top), "__path__", None)
    for part in rest:
        spec = importlib.machinery.PathFinder.find_spec(part, path) if path is not None else None
        if spec is None:
            return False
        path = spec.submodule_search_locations
    return True


def _check_target_exists(fix: Fix) -> None:
    """Once the library is imported: a patch waiting for a module the library does not have would never apply."""
    if fix.state.startswith("waiting") and fix.module and not _module_exists(fix.module):
        _fail(fix, f"{fix.library} {_library_version(fix.library)} has no module {fix.module}")


def install(fix: Fix) -> None:
    """Apply ``fix`` now, or when its module is imported. Idempotent."""
    from hf_tpu.plumbing.import_hooks import when_imported

    with _lock:
        if fix.state.startswith(("applied", "waiting", "not needed", "failed")):
            return
        if fix.module is None:
            _run(fix, None)
            return
        target = _resolve_target(fix)
        if target is None:
            return
        fix.module = target
        fix.state = f"waiting: applied when {fix.module} is imported"
    when_imported(fix.module, lambda module: _run(fix, module) if fix.state.startswith("waiting") else None)
    if fix.library != fix.module:
        when_imported(fix.library, lambda _module: _check_target_exists(fix))


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
