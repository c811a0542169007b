"""The two ways a workaround changes things, each undoable: a kernel registered for the ``"tpu"``
device (PrivateUse1) through ``torch.library``, or a Python attribute replaced by a wrapper."""

from __future__ import annotations

import functools
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


OptionsCheck = Callable[[dict[str, Any]], None]
GraphRewrite = Callable[[torch.fx.GraphModule], None]
RuntimeWrap = Callable[[Callable[..., Any], torch.fx.GraphModule, list[Any]], Callable[..., Any]]


class TpuCompileHooks:
    """Changes to what the ``"tpu"`` compile backend does, each added and removed by name.

    ``check(options)`` sees the ``options=`` of each compile; ``rewrite(gm)`` edits the Dynamo graph before the
    backend sees it; ``wrap(compiled, gm, example_inputs)`` returns the callable Dynamo runs instead of the backend's. One patch of the backend's ``__call__`` (TorchTPU's
    ``TpuBackend`` or the emulator's: the class of whatever Dynamo's registry holds for "tpu") applies the hooks in
    the order they were added, so hooks compose and come off in any order.
    """

    def __init__(self) -> None:
        self._checks: dict[str, OptionsCheck] = {}
        self._rewrites: dict[str, GraphRewrite] = {}
        self._wraps: dict[str, RuntimeWrap] = {}
        self._patched: tuple[type, Any] | None = None

    def add(
        self,
        name: str,
        *,
        check: OptionsCheck | None = None,
        rewrite: GraphRewrite | None = None,
        wrap: RuntimeWrap | None = None,
    ) -> None:
        if check is not None:
            self._checks[name] = check
        if rewrite is not None:
            self._rewrites[name] = rewrite
        if wrap is not None:
            self._wraps[name] = wrap
        from hf_tpu.plumbing.import_hooks import when_imported

        when_imported("torch._dynamo", self._patch)

    def remove(self, name: str) -> None:
        self._checks.pop(name, None)
        self._rewrites.pop(name, None)
        self._wraps.pop(name, None)

    def _patch(self, _module: Any = None) -> None:
        # the registry's own table: list_backends()/lookup_backend() import every backend, Inductor's included,
        # which must not happen while Dynamo itself may still be mid-import
        from torch._dynamo.backends.registry import _COMPILER_FNS

        backend = _COMPILER_FNS.get("tpu")
        if self._patched is not None or backend is None:
            return
        cls = type(backend)
        original = cls.__call__
        hooks = self

        @functools.wraps(original)
        def call(self: Any, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
            for check in list(hooks._checks.values()):
                check(kwargs.get("options") or {})
            for rewrite in list(hooks._rewrites.values()):
                rewrite(gm)
            compiled = original(self, gm, example_inputs, **kwargs)
            for wrap in list(hooks._wraps.values()):
                compiled = wrap(compiled, gm, list(example_inputs))
            return compiled

        cls.__call__ = call
        self._patched = (cls, original)


tpu_compile_hooks = TpuCompileHooks()


def calling_like(compiled: Callable[..., Any], run: Callable[[list[Any]], Any]) -> Callable[..., Any]:
    """What Dynamo calls instead of a backend's ``compiled``: ``run(list(args))``, with ``compiled``'s attributes
    (``serialize``, ``zero_grad``, ...). Dynamo calls a backend's result with ``*args``."""

    def call(*args: Any) -> Any:
        return run(list(args))

    for attr in ("serialize", "zero_grad", "named_parameters", "named_buffers"):
        if hasattr(compiled, attr):
            setattr(call, attr, getattr(compiled, attr))
    call.__wrapped__ = compiled  # type: ignore[attr-defined]
    return call
