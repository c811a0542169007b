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
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hf_tpu.emulator import _build
from hf_tpu.emulator.api_stage import warn_experimental

_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")
# TorchTPU's schema types for static (non-tensor) parameters: ints are SymInt, as for torch's own ops.
_STATIC_SCHEMA = {bool: "bool", int: "SymInt", float: "float", str: "str", torch.dtype: "ScalarType",
                  torch.device: "Device"}  # fmt: skip


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
    """(kind, schema type) of a parameter annotation: kind is "tensor", "tensor?", "tensors", "enum" or "static"."""
    tensor_types = (jax.Array, torch.Tensor)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation in tensor_types:
        return "tensor", "Tensor"
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in tensor_types:
            return "tensor?", "Tensor?"
    if origin in (typing.Union, types.UnionType) and set(args) <= {int, float} and len(args) == 2:
        return "static", "Scalar"
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in tensor_types:
        return "tensors", "Tensor[]"
    if annotation in _STATIC_SCHEMA:
        return "static", _STATIC_SCHEMA[annotation]
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in (int, bool, float):
        return "static", f"{_STATIC_SCHEMA[args[0]]}[]"
    if origin is typing.Literal:
        return "static", _STATIC_SCHEMA.get(type(args[0]), "str")
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        # an Enum travels as its members' value, typed as the values are (TorchTPU 0.2.0, run on the real wheel:
        # integer values give SymInt, strings str)
        kinds = {type(member.value) for member in annotation}
        value_type = kinds.pop() if len(kinds) == 1 else str
        return "enum", "SymInt" if value_type is int else _STATIC_SCHEMA.get(value_type, "str")
    raise ValueError(f"unsupported annotation {annotation!r}")


def _returns(annotation: Any, jax: Any) -> tuple[str, int | None]:
    """Schema of the return annotation and the number of tensors (None: a single tensor, 0: nothing)."""
    tensor_types = (jax.Array, torch.Tensor)
    if annotation in tensor_types:
        return "Tensor", None
    if annotation is None or annotation is type(None):
        return "()", 0
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in tensor_types:
            return "Tensor?", None
    if origin is tuple and args and all(a in tensor_types for a in args) and Ellipsis not in args:
        return "(" + ", ".join("Tensor" for _ in args) + ")", len(args)
    if origin in (list, tuple, collections.abc.Sequence) and args and args[0] in tensor_types:
        return "Tensor[]", -1
    raise ValueError(f"jax_op: unsupported return annotation {annotation!r}; return a jax.Array or a tuple of them.")


# dtypes NumPy has: their tensors enter the jitted function as NumPy views of their memory, which jit's C++ dispatch
# takes in ~3 us; jax.dlpack.from_dlpack costs ~19 us a tensor (Python checks, asarray, placement), a third of a
# small MoE layer's call. bfloat16 and the float8s have no NumPy dtype and cross through DLPack.
_NUMPY_DTYPES = frozenset(
    (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
     torch.bool, torch.complex64, torch.complex128)
)  # fmt: skip


def _to_jax(t: torch.Tensor | None, jax: Any) -> Any:
    """The tensor as a JAX argument: a view of its memory (a non-contiguous tensor is made contiguous first)."""
    if t is None:
        return None
    cpu = (_build.load().cpu_alias(t) if t.device.type == "tpu" else t).detach().contiguous()
    return cpu.numpy() if cpu.dtype in _NUMPY_DTYPES else jax.dlpack.from_dlpack(cpu)


def _to_torch(a: Any, device: torch.device) -> torch.Tensor:
    cpu = torch.from_dlpack(a)
    return (
        _build.load().wrap_cpu(cpu, device.index if device.index is not None else -1) if device.type == "tpu" else cpu
    )


@dataclass
class _Param:
    name: str
    kind: str  # "tensor", "tensor?", "tensors", "enum", "static"
    keyword: bool  # keyword-only
    enum: type[enum.Enum] | None = None


class _JaxCustomOpDef(torch._library.custom_ops.CustomOpDef):
    """What ``jax_op`` returns, as on TorchTPU: a torch custom op (``register_autograd``, ``register_fake``,
    ``torch.compile``) whose call also accepts the Enum members its JAX function takes."""

    _jax_params: list[_Param]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        positional = [p for p in self._jax_params if not p.keyword]
        args = tuple(_enum_to_int(a, p) for a, p in zip(args, positional, strict=False)) + args[len(positional) :]
        by_name = {p.name: p for p in self._jax_params}
        kwargs = {k: _enum_to_int(v, by_name[k]) if k in by_name else v for k, v in kwargs.items()}
        return super().__call__(*args, **kwargs)


def _enum_to_int(value: Any, param: _Param) -> Any:
    if param.kind == "enum" and isinstance(value, enum.Enum):
        return value.value
    return value


class _JaxFunction:
    """The jitted JAX function behind one op, and the conversions between its arguments and the op's."""

    def __init__(self, name: str, fn: Callable[..., Any], donate_argnums: Sequence[int], mesh: Any) -> None:
        jax = _require_jax()
        if not _NAME.match(name):
            raise ValueError(f"Op name {name} does not contain a namespace.")  # TorchTPU's words
        label = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", repr(fn))
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn.func if isinstance(fn, functools.partial) else fn)
        self.params: list[_Param] = []
        schema_args, star = [], False
        bound = fn.keywords if isinstance(fn, functools.partial) else {}
        for p in sig.parameters.values():
            if p.name in bound:
                continue  # fixed by functools.partial: not a parameter of the op (as on TorchTPU)
            if p.name not in hints:  # TorchTPU's words
                raise ValueError(f"Missing argument type annotation for JAX function: {sig}.")
            try:
                kind, schema = _kind(hints[p.name], jax)
            except ValueError as err:
                raise ValueError(f"jax_op {name!r}: parameter {p.name!r}: {err}") from None
            keyword = p.kind is inspect.Parameter.KEYWORD_ONLY
            self.params.append(_Param(p.name, kind, keyword, hints[p.name] if kind == "enum" else None))
            default = ""
            if p.default is not inspect.Parameter.empty:
                value = p.default
                value = value.value if isinstance(value, enum.Enum) else value
                default = "=None" if value is None else f"={value!r}"
            if keyword and not star:
                schema_args.append("*")
                star = True
            schema_args.append(f"{schema} {p.name}{default}")
        if "return" not in hints:
            raise ValueError(f"jax_op {name!r}: {label} needs a return annotation (jax.Array or a tuple).")
        ret_schema, self.n_out = _returns(hints["return"], jax)
        tensor_positions = [i for i, p in enumerate(self.params) if p.kind.startswith("tensor")]
        for i in donate_argnums:
            if i not in tensor_positions:
                names = {self.params[i].name} if i < len(self.params) else {i}
                raise ValueError(  # what jax.jit says, through TorchTPU
                    f"static_argnames and donate_argnames cannot intersect. Argument names {names} appear in both "
                    "static_argnames and donate_argnames"
                )
        if mesh is not None:
            raise NotImplementedError(
                "jax_op(mesh=...) is not emulated: the emulated TPU runs JAX on one CPU device per process. Call the "
                "op on each rank's local shard instead."
            )
        static_pos = [i for i, p in enumerate(self.params) if not p.keyword and not p.kind.startswith("tensor")]
        static_names = [p.name for p in self.params if p.keyword and not p.kind.startswith("tensor")]
        self.jitted = jax.jit(fn, static_argnums=static_pos, static_argnames=static_names, keep_unused=True)
        self.schema = f"({', '.join(schema_args)}) -> {ret_schema}"

    def _device(self, values: Sequence[Any]) -> torch.device:
        for value in values:
            if isinstance(value, torch.Tensor):
                return value.device
            if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
                return value[0].device
        return torch.device("cpu")

    def _convert(self, value: Any, param: _Param, jax: Any, tensor: Callable[[Any], Any]) -> Any:
        if param.kind in ("tensor", "tensor?"):
            return tensor(value)
        if param.kind == "tensors":
            return [tensor(t) for t in value]
        if param.kind == "enum":
            return param.enum(int(value) if isinstance(value, torch.SymInt) else value)  # type: ignore[misc]
        if isinstance(value, torch.dtype):
            return jax.numpy.dtype(str(value).removeprefix("torch."))
        if isinstance(value, torch.SymInt):
            return int(value)
        return tuple(int(v) if isinstance(v, torch.SymInt) else v for v in value) if isinstance(value, list) else value

    def _call(self, args: Sequence[Any], kwargs: dict[str, Any], tensor: Callable[[Any], Any]) -> Any:
        jax = _require_jax()
        positional = [p for p in self.params if not p.keyword]
        by_name = {p.name: p for p in self.params}
        jax_args = [self._convert(a, p, jax, tensor) for a, p in zip(args, positional, strict=False)]
        jax_kwargs = {k: self._convert(v, by_name[k], jax, tensor) for k, v in kwargs.items()}
        return jax_args, jax_kwargs

    def _outputs(self, result: Any) -> Any:
        if self.n_out is None or self.n_out == 0:
            return result if self.n_out is None else None
        return tuple(result) if self.n_out > 0 else list(result)

    def impl(self, *args: Any, **kwargs: Any) -> Any:
        jax = _require_jax()
        device = self._device([*args, *kwargs.values()])
        jax_args, jax_kwargs = self._call(args, kwargs, lambda t: _to_jax(t, jax))
        result = self.jitted(*jax_args, **jax_kwargs)
        if result is None:
            return None
        leaves, tree = jax.tree_util.tree_flatten(result)
        tensors = [_to_torch(leaf, device) for leaf in leaves]
        return self._outputs(jax.tree_util.tree_unflatten(tree, tensors))

    def fake(self, *args: Any, **kwargs: Any) -> Any:
        jax = _require_jax()
        device = self._device([*args, *kwargs.values()])

        def spec(t: torch.Tensor | None) -> Any:
            if t is None:
                return None
            return jax.ShapeDtypeStruct(tuple(t.shape), jax.numpy.dtype(str(t.dtype).removeprefix("torch.")))

        jax_args, jax_kwargs = self._call(args, kwargs, spec)
        shapes = jax.eval_shape(self.jitted, *jax_args, **jax_kwargs)
        if shapes is None:
            return None
        leaves, tree = jax.tree_util.tree_flatten(shapes)
        tensors = [torch.empty(s.shape, dtype=getattr(torch, str(s.dtype)), device=device) for s in leaves]
        return self._outputs(jax.tree_util.tree_unflatten(tree, tensors))


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
    """Register ``fn`` (a JAX function with annotated parameters) as the torch op ``name``; decorator or call.

    Returns a ``torch.library`` custom op (a ``CustomOpDef``), as TorchTPU does."""

    def register(f: Callable[..., Any]) -> _JaxCustomOpDef:
        function = _JaxFunction(name, f, tuple(donate_argnums or ()), mesh)
        op = torch.library.custom_op(name, function.impl, mutates_args=(), schema=function.schema)
        op.register_fake(function.fake)
        op.__class__ = _JaxCustomOpDef  # adds the Enum conversion; a CustomOpDef in every other respect
        op._jax_params = function.params
        op._jax_function = function
        return op

    return register if fn is None else register(fn)


def get_pallas_mesh(
    axis_names: Sequence[str] | str,
    mesh_shape: Sequence[int] | None = None,
    process_group: Any = None,
) -> Any:
    """A ``jax.sharding.Mesh`` over the job's ranks, for Pallas kernels that communicate (TorchTPU's checks).

    The emulated TPU runs JAX on one CPU device per process, so a mesh can span one rank only."""
    import torch.distributed as dist

    jax = _require_jax()
    warn_experimental("pallas.get_pallas_mesh")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized. dist.init_process_group()")  # TorchTPU's words
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    world = dist.get_world_size(process_group)
    shape = (world,) if mesh_shape is None else tuple(mesh_shape)
    if mesh_shape is None and len(names) != 1:
        raise ValueError(f"mesh_shape is required for {len(names)} axes {names}.")
    if len(shape) != len(names) or math.prod(shape) != world:
        raise ValueError(f"mesh_shape {shape} must have one size per axis {names} and {world} devices in all.")
    if world != 1:
        raise NotImplementedError(
            "get_pallas_mesh over several ranks is not emulated: each emulated process runs JAX on one CPU device."
        )
    import numpy as np

    return jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(shape), names)


def build_module() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.pallas", __doc__)
    mod.jax_op = jax_op
    mod.get_pallas_mesh = get_pallas_mesh
    mod.__all__ = ["get_pallas_mesh", "jax_op"]
    return mod
