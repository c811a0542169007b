"""``torch.tpu.pallas`` for the emulated TPU: run a jitted JAX function as a torch op.

Same signature checks as TorchTPU's ``jax_op``; where TorchTPU exports the function to
StableHLO and runs it on the chip, the emulator runs the jitted function with JAX on CPU,
exchanging tensors through DLPack without copies. The op is a ``torch.library`` custom op
with a fake implementation (shapes from ``jax.eval_shape``), so it composes with
``torch.compile``. Pallas kernels need ``interpret=True`` on CPU.
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _build

_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")
_STATIC_SCHEMA = {bool: "bool", int: "int", float: "float", str: "str", torch.dtype: "ScalarType"}


def _require_jax() -> Any:
    try:
        import jax
    except ImportError as err:
        raise ImportError(
            "JAX/Pallas is not available: torch.tpu.pallas needs jax. Install it with `pip install 'hf-tpu[tpu]'` "
            "(or `pip install jax`)."
        ) from err
    return jax


def _kind(annotation: Any, jax: Any) -> tuple[str, str]:
    """(kind, schema type) of a parameter annotation: kind is "tensor", "tensor?", "tensors" or "static"."""
    tensor_types = (jax.Array, torch.Tensor)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in tensor_types:
        return "tensor", "Tensor"
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in tensor_types:
            return "tensor?", "Tensor?"
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in tensor_types:
        return "tensors", "Tensor[]"
    if annotation in _STATIC_SCHEMA:
        return "static", _STATIC_SCHEMA[annotation]
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in (int, bool, float):
        return "static", f"{_STATIC_SCHEMA[args[0]]}[]"
    if origin is typing.Literal:
        return "static", _STATIC_SCHEMA.get(type(args[0]), "str")
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        raise ValueError(f"Enum parameters ({annotation.__name__}) are not supported by the emulated jax_op yet.")
    raise ValueError(f"unsupported annotation {annotation!r}")


def _returns(annotation: Any, jax: Any) -> tuple[str, int | None]:
    """Schema of the return annotation and the number of tensors (None: a single tensor)."""
    tensor_types = (jax.Array, torch.Tensor)
    if annotation in tensor_types:
        return "Tensor", None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tuple and args and all(a in tensor_types for a in args) and Ellipsis not in args:
        return "(" + ", ".join("Tensor" for _ in args) + ")", len(args)
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in tensor_types:
        return "Tensor[]", -1
    raise ValueError(f"jax_op: unsupported return annotation {annotation!r}; return a jax.Array or a tuple of them.")


def _to_jax(t: torch.Tensor | None, jax: Any) -> Any:
    if t is None:
        return None
    cpu = _build.load().cpu_alias(t) if t.device.type == "tpu" else t
    return jax.dlpack.from_dlpack(cpu.detach().contiguous())


def _to_torch(a: Any, device: torch.device) -> torch.Tensor:
    cpu = torch.from_dlpack(a)
    return (
        _build.load().wrap_cpu(cpu, device.index if device.index is not None else -1) if device.type == "tpu" else cpu
    )


class JaxOp:
    """A jitted JAX function registered as a torch custom op (what ``jax_op`` returns)."""

    def __init__(self, name: str, fn: Callable[..., Any], donate_argnums: Sequence[int], mesh: Any) -> None:
        jax = _require_jax()
        if not _NAME.match(name):
            raise ValueError(f"jax_op: name must be 'namespace::op_name' with exactly one '::', got {name!r}.")
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        self.params: list[tuple[str, str]] = []
        schema_args = []
        for p in sig.parameters.values():
            if p.name not in hints:
                raise ValueError(
                    f"jax_op {name!r}: parameter {p.name!r} of {fn.__name__} has no type annotation; annotate "
                    "tensors as jax.Array and static values as int/float/bool/str."
                )
            try:
                kind, schema = _kind(hints[p.name], jax)
            except ValueError as err:
                raise ValueError(f"jax_op {name!r}: parameter {p.name!r}: {err}") from None
            self.params.append((p.name, kind))
            default = ""
            if p.default is not inspect.Parameter.empty:
                default = "=None" if p.default is None else f"={p.default!r}"
            schema_args.append(f"{schema} {p.name}{default}")
        if "return" not in hints:
            raise ValueError(f"jax_op {name!r}: {fn.__name__} needs a return annotation (jax.Array or a tuple).")
        ret_schema, self.n_out = _returns(hints["return"], jax)
        tensor_positions = [i for i, (_, k) in enumerate(self.params) if k != "static"]
        for i in donate_argnums:
            if i not in tensor_positions:
                raise ValueError(f"jax_op {name!r}: donate_argnums contains {i}, which is not a tensor parameter.")
        if mesh is not None:
            raise NotImplementedError(
                "jax_op(mesh=...) is not emulated: the emulated TPU runs JAX on one CPU device per process. Call the "
                "op on each rank's local shard instead."
            )
        self.name = name
        static = [i for i, (_, k) in enumerate(self.params) if k == "static"]
        self.jitted = jax.jit(fn, static_argnums=static, keep_unused=True)
        self.schema = f"({', '.join(schema_args)}) -> {ret_schema}"
        self.op = torch.library.custom_op(name, self._impl, mutates_args=(), schema=self.schema)
        self.op.register_fake(self._fake)

    def _device(self, args: Sequence[Any]) -> torch.device:
        for a, (_, kind) in zip(args, self.params, strict=False):
            if isinstance(a, torch.Tensor):
                return a.device
            if kind == "tensors" and a:
                return a[0].device
        return torch.device("cpu")

    def _jax_args(self, args: Sequence[Any], jax: Any, convert: Callable[[Any], Any]) -> list[Any]:
        out = []
        for a, (_, kind) in zip(args, self.params, strict=False):
            if kind in ("tensor", "tensor?"):
                out.append(convert(a))
            elif kind == "tensors":
                out.append([convert(t) for t in a])
            elif isinstance(a, torch.dtype):
                out.append(jax.numpy.dtype(str(a).removeprefix("torch.")))
            else:
                out.append(tuple(a) if isinstance(a, list) else a)
        return out

    def _outputs(self, result: Any) -> Any:
        if self.n_out is None:
            return result
        return tuple(result) if self.n_out > 0 else list(result)

    def _impl(self, *args: Any) -> Any:
        jax = _require_jax()
        device = self._device(args)
        result = self.jitted(*self._jax_args(args, jax, lambda t: _to_jax(t, jax)))
        leaves, tree = jax.tree_util.tree_flatten(result)
        tensors = [_to_torch(leaf, device) for leaf in leaves]
        return self._outputs(jax.tree_util.tree_unflatten(tree, tensors))

    def _fake(self, *args: Any) -> Any:
        jax = _require_jax()
        device = self._device(args)

        def spec(t: torch.Tensor | None) -> Any:
            if t is None:
                return None
            return jax.ShapeDtypeStruct(tuple(t.shape), jax.numpy.dtype(str(t.dtype).removeprefix("torch.")))

        shapes = jax.eval_shape(self.jitted, *self._jax_args(args, jax, spec))
        leaves, tree = jax.tree_util.tree_flatten(shapes)
        tensors = [torch.empty(s.shape, dtype=getattr(torch, str(s.dtype)), device=device) for s in leaves]
        return self._outputs(jax.tree_util.tree_unflatten(tree, tensors))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.op(*args, **kwargs)

    def register_autograd(self, *args: Any, **kwargs: Any) -> None:
        self.op.register_autograd(*args, **kwargs)

    def register_fake(self, fn: Callable[..., Any]) -> None:
        self.op.register_fake(fn)


def jax_op(
    name: str,
    fn: Callable[..., Any] | None = None,
    /,
    *,
    donate_argnums: Sequence[int] | None = None,
    mesh: Any = None,
    input_partition_specs: Any = None,
    output_partition_specs: Any = None,
) -> Any:
    """Register ``fn`` (a JAX function with annotated parameters) as the torch op ``name``; decorator or call."""

    def register(f: Callable[..., Any]) -> JaxOp:
        return JaxOp(name, f, tuple(donate_argnums or ()), mesh)

    return register if fn is None else register(fn)


def build_module() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.pallas", __doc__)
    mod.jax_op = jax_op
    mod.__all__ = ["jax_op"]
    return mod
