"""Run a function right after a module is imported (or now, if it already is).

Integrations patch Hugging Face libraries only once the user imports them, so
``import hf_tpu`` (and ``import torch``) never imports transformers or diffusers.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()  # re-entrant: a hook may import a module that has hooks of its own
# Modules that were mid-import when a hook was attached (e.g. `import accelerate` imports torch, whose autoload
# installs hf-tpu, while accelerate.accelerator is still executing): their hooks run once they have finished.
_pending: dict[str, ModuleType] = {}


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _run_finished() -> None:
    with _lock:
        for name, module in list(_pending.items()):
            if not _initializing(module):
                del _pending[name]
                _run(module)


class _Loader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self.wrapped = wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.wrapped.exec_module(module)
        _run(module)
        if _pending:
            _run_finished()

    def __getattr__(self, name: str) -> object:  # get_source, is_package, ... for tools that ask
        return getattr(self.wrapped, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if _pending:
            _run_finished()  # the next import after a pending module finished
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def _run(module: ModuleType) -> None:
    with _lock:
        hooks = _hooks.get(module.__name__, [])
        done = getattr(module, "__hf_tpu_hooks__", set())
        for hook in hooks:
            if hook not in done:
                done.add(hook)
                hook(module)
        module.__hf_tpu_hooks__ = done  # type: ignore[attr-defined]


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(module)`` once ``name`` is imported; immediately if it already is."""
    with _lock:
        _hooks.setdefault(name, []).append(hook)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        module = sys.modules.get(name)
        if module is not None and _initializing(module):
            _pending[name] = module
            return
    if module is not None:
        _run(module)
