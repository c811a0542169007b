"""TorchTPU's API stages: the strict guard on legacy device APIs and the experimental warning.

TorchTPU 0.2.0 (torch >= 2.11) makes ``torch.tpu.is_available``, ``device_count``,
``synchronize``, ``current_stream``... internal: called from anywhere but torch or
torch_tpu they raise, pointing at ``torch.accelerator``. Libraries that call them (diffusers'
``TorchDeviceBackend``) break on a real TPU, so the emulator breaks them the same way.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from hf_tpu import settings

F = TypeVar("F", bound=Callable[..., Any])

_PREFIX_EXPERIMENTAL = "<TorchTpu/ApiStage/ExperimentalApi/>"
_PREFIX_INTERNAL = "<TorchTpu/ApiStage/InternalApi/>"
_warned: set[str] = set()


def _is_framework(module: str) -> bool:
    """torch and torch_tpu count as the framework; so does the emulator, which stands in for torch_tpu (not the rest of hf_tpu)."""
    return any(module == root or module.startswith(root + ".") for root in ("torch", "torch_tpu", "hf_tpu.emulator"))


def _caller_module(depth: int) -> str:
    frame = sys._getframe(depth + 1)
    return frame.f_globals.get("__name__", "")


def _is_compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


_ABSL_TRUE = ("1", "true", "t", "yes", "y")


def _legacy_apis_allowed() -> bool:
    """``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS``, read once as TorchTPU reads it: an absl boolean (1/true/t/yes/y,
    any case; anything else is false), announced as an experimental setting when set."""
    value = settings.text("TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS")
    if value is None:
        return False
    warnings.warn(
        f"{_PREFIX_EXPERIMENTAL} the TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS environment variable is an experimental "
        "feature and may change or be removed without notice.",
        UserWarning,
        stacklevel=2,
    )
    return value.strip().lower() in _ABSL_TRUE


_LEGACY_APIS_ALLOWED: bool | None = None


def check_internal(name: str, replacement: str, *, depth: int = 1) -> None:
    """Raise TorchTPU's RuntimeError if ``torch.tpu.<name>`` was called from user code."""
    if _is_framework(_caller_module(depth + 1)) or _is_compiling():
        return
    global _LEGACY_APIS_ALLOWED
    if _LEGACY_APIS_ALLOWED is None:
        _LEGACY_APIS_ALLOWED = _legacy_apis_allowed()
    if _LEGACY_APIS_ALLOWED:
        if name not in _warned:
            _warned.add(name)
            warnings.warn(
                f"{_PREFIX_INTERNAL} {name} is internal to TorchTPU and may change or be removed without notice. "
                f"Use torch.accelerator.{replacement} instead.",
                UserWarning,
                stacklevel=depth + 2,
            )
        return
    raise RuntimeError(
        f"{name} is internal to TorchTPU and can only be called by the PyTorch framework (torch and torch_tpu). "
        f"Use torch.accelerator.{replacement} instead."
    )


def internal(replacement: str) -> Callable[[F], F]:
    """Mark a ``torch.tpu`` function internal; ``replacement`` names its ``torch.accelerator`` twin."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            check_internal(fn.__name__, replacement, depth=1)
            return fn(*args, **kwargs)

        wrapper.__tt_api_stage__ = "internal"  # type: ignore[attr-defined]
        wrapper.__tt_api_prefer__ = f"torch.accelerator.{replacement}"  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def warn_experimental(name: str, *, depth: int = 1) -> None:
    """The once-per-process warning of an experimental ``torch.tpu`` API, unless the caller is the framework."""
    if name not in _warned and not _is_framework(_caller_module(depth + 1)):
        _warned.add(name)
        warnings.warn(
            f"{_PREFIX_EXPERIMENTAL} torch.tpu.{name} is an experimental API and may change.",
            UserWarning,
            stacklevel=depth + 2,
        )


def experimental(fn: F) -> F:
    """Warn once per process when user code first calls an experimental ``torch.tpu`` API."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warn_experimental(fn.__name__, depth=1)
        return fn(*args, **kwargs)

    wrapper.__tt_api_stage__ = "experimental"  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
