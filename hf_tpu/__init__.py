"""hf-tpu: Hugging Face libraries on Google TPUs through TorchTPU, and an emulated TPU to develop on.

Importing this package does nothing heavy: the device is set up by the ``torch.backends``
autoload entry point (``HF_TPU_EMULATE=1`` for the emulator) or by ``hf_tpu.emulator.enable()``.
"""

from __future__ import annotations

__version__ = "0.1.0"
from typing import TYPE_CHECKING, Any

from hf_tpu.plumbing import device_ready as _hooks

if TYPE_CHECKING:
    from hf_tpu.collectives import CollectiveCounts, count_collectives
    from hf_tpu.compilations import Compilations, count_compilations
    from hf_tpu.recompiles import (
        CompileReport,
        GraphCompile,
        RecompileError,
        compile_report,
        strict_recompile,
        watch_compiles,
    )
    from hf_tpu.warmup import WarmUp, warm_up_generate, warm_up_pipeline

_LAZY = {"CompileReport", "GraphCompile", "RecompileError", "compile_report", "strict_recompile", "watch_compiles"}
_LAZY_COLLECTIVES = {"CollectiveCounts", "count_collectives"}
_LAZY_OTHERS = {
    "Compilations": "compilations",
    "count_compilations": "compilations",
    "WarmUp": "warmup",
    "warm_up_generate": "warmup",
    "warm_up_pipeline": "warmup",
}

__all__ = [
    "CollectiveCounts",
    "CompileReport",
    "Compilations",
    "GraphCompile",
    "RecompileError",
    "__version__",
    "backend",
    "WarmUp",
    "compile_report",
    "count_collectives",
    "count_compilations",
    "strict_recompile",
    "warm_up_generate",
    "warm_up_pipeline",
    "watch_compiles",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: `import torch` runs our autoload, which must stay cheap.
    if name in _LAZY:
        from hf_tpu import recompiles

        return getattr(recompiles, name)
    if name in _LAZY_COLLECTIVES:
        from hf_tpu import collectives

        return getattr(collectives, name)
    if name in _LAZY_OTHERS:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY_OTHERS[name]}", __name__), name)
    raise AttributeError(f"module 'hf_tpu' has no attribute {name!r}")


def backend() -> str:
    """Which TPU this process uses: ``"tpu"`` (TorchTPU on a chip), ``"xla_cpu"`` (TorchTPU on XLA:CPU),
    ``"emulated"`` or ``"none"``."""
    from hf_tpu.plumbing.backend import backend as _backend

    return _backend()


def _install_integrations() -> None:
    from hf_tpu._autoload import install_integrations

    install_integrations()


_hooks.on_device_ready(_install_integrations)
