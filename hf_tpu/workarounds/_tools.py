"""The two ways a workaround changes things, each undoable: a kernel registered for the ``"tpu"``
device (PrivateUse1) through ``torch.library``, or a Python attribute replaced by a wrapper."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map


class Kernels:
    """Python kernels for aten ops on the TPU device; :meth:`remove` takes them out again."""

    def __init__(self) -> None:
        self._library: Any = None

    def register(self, ops: dict[str, Callable[..., Any]], dispatch_key: str = "PrivateUse1") -> None:
        self._library = torch.library.Library("aten", "IMPL")  # noqa: TOR901
        with warnings.catch_warnings():
            # Replacing a backend's own kernel is the point; the dispatcher's override warning is not news.
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            warnings.filterwarnings("ignore", message=".*Warning only once for all operators.*")
            for name, fn in ops.items():
                self._library.impl(name, fn, dispatch_key)

    def remove(self) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None


def on_cpu(op: Any) -> Callable[..., Any]:
    """A kernel that runs ``op`` on CPU copies of its tpu tensors and moves the results back."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        device = next(
            (t.device for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)),
            torch.device("cpu"),
        )

        def to_cpu(x: Any) -> Any:
            return x.cpu() if isinstance(x, torch.Tensor) and x.device.type == "tpu" else x

        out = op(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
        return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, out)

    kernel.__name__ = f"{op.__name__}_on_cpu"
    return kernel


class Wrapped:
    """``owner.name`` replaced by ``make(original)``; :meth:`restore` puts the original back."""

    def __init__(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        self.owner, self.name = owner, name
        self.original = getattr(owner, name)
        wrapper = make(self.original)
        try:
            wrapper.__wrapped__ = self.original
        except AttributeError:
            pass
        setattr(owner, name, wrapper)

    def restore(self) -> None:
        setattr(self.owner, self.name, self.original)


class Patch:
    """A :class:`Wrapped` attribute as a workaround's ``apply`` / ``revert`` pair."""

    def __init__(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        self.owner, self.name, self.make = owner, name, make
        self._wrapped: Wrapped | None = None

    def apply(self, module: Any = None) -> None:
        if self._wrapped is None:
            self._wrapped = Wrapped(module if self.owner is None else self.owner, self.name, self.make)

    def revert(self) -> None:
        if self._wrapped is not None:
            self._wrapped.restore()
            self._wrapped = None


def on_tpu(*tensors: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)
