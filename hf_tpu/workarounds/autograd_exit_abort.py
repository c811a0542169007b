"""torch's autograd at exit: a process that ran a backward on the device exits cleanly instead of aborting.

torch 2.13 stashes ``contextvars.copy_context()`` in autograd's thread-local state before every backward
(``torch/autograd/graph.py``, ``_engine_run_backward``), and the GraphTask keeps a copy. The engine runs a
device's part of the backward on its own worker thread, which can hold the task's last reference; when it
drops it while the interpreter is finalizing, taking the GIL ends that thread with ``pthread_exit``
through a ``noexcept`` destructor: ``std::terminate``, exit status 134 ("terminate called without an
active exception"), in about half the runs of a script that ends right after a backward. Any non-CPU
device can hit it; the emulated TPU did.

At exit, before finalization, this runs one tiny backward on each device used, straight through the
engine (so its task holds no Python object). A worker's queue is first in, first out: once it returns,
the worker has dropped every earlier task, and the last one needs no GIL to die.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import torch

from hf_tpu.fixes import Fix

_state = threading.Lock()  # guards the engine swap in apply/revert; nothing under it imports or calls out
_ran_backward = False
_installed = False
_originals: dict[str, Any] = {}


def _note_backward(original: Any) -> Any:
    def _engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        global _ran_backward
        _ran_backward = True
        return original(*args, **kwargs)

    _engine_run_backward.__wrapped__ = original  # type: ignore[attr-defined]
    return _engine_run_backward


def _devices_used() -> list[int]:
    """Device indices with memory allocated at some point (their worker threads may hold a task)."""
    used = []
    for index in range(torch.accelerator.device_count()):
        try:
            if torch.accelerator.max_memory_allocated(index) > 0:
                used.append(index)
        except Exception:  # noqa: BLE001  (a chip this process may not touch)
            continue
    return used or [torch.accelerator.current_device_index()]


def drain_autograd_workers() -> None:
    """Make every device worker of autograd drop the tasks it holds (what runs at exit)."""
    if not _ran_backward:
        return
    engine = torch.autograd.Variable._execution_engine
    for index in _devices_used():
        try:
            device = torch.device("tpu", index)
            with torch.enable_grad():
                leaf = torch.zeros((), device=device, requires_grad=True)
                root = leaf * 1.0
                engine.run_backward((root,), (torch.ones((), device=device),), False, False, (), True, True)
        except Exception:  # noqa: BLE001  (exit must go on; the worst case is the abort this avoids)
            continue


def apply() -> None:
    global _installed
    with _state:
        for module in (torch.autograd.graph, torch.autograd):
            _originals.setdefault(module.__name__, module._engine_run_backward)
            module._engine_run_backward = _note_backward(_originals[module.__name__])
        if not _installed:
            atexit.register(lambda: drain_autograd_workers() if _originals else None)
            _installed = True


def revert() -> None:
    global _ran_backward
    with _state:
        for module in (torch.autograd.graph, torch.autograd):
            if module.__name__ in _originals:
                module._engine_run_backward = _originals.pop(module.__name__)
        _ran_backward = False


WORKAROUNDS = (
    Fix.workaround(
        "autograd_drained_at_exit",
        "autograd_exit_abort",
        "torch.autograd's backward entry point, and an atexit hook",
        __doc__,
        apply,
        revert,
    ),
)
