"""Print the public surface of whatever ``torch.tpu`` this interpreter has, as JSON (one object on stdout).

Run by ``tests/contract/test_contract.py`` twice: in an environment with the real torch-tpu wheel (no chip:
a stub libtpu, ``TPU_SKIP_MDS_QUERY=1``) and in hf-tpu's own environment with the emulated TPU. Standalone on
purpose (the real environment has no hf-tpu): only the standard library and torch. Nothing here starts a TPU
runtime: names, signatures, op schemas, and behaviours that validate arguments before any device work.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import io
import json
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

MODULES = (
    "torch.tpu",
    "torch.tpu.compiler",
    "torch.tpu.distributed",
    "torch.tpu.ops",
    "torch.tpu.optimizers",
    "torch.tpu.pallas",
    "torch.tpu.profiler",
)
# Names TorchTPU leaves out on purpose (Hugging Face libraries branch on hasattr), and names only an emulator
# would add.
ABSENT = (
    "empty_cache",
    "mem_get_info",
    "memory_allocated",
    "max_memory_allocated",
    "is_bf16_supported",
    "get_device_capability",
    "amp",
    "random",
    "TpuStream",
    "TpuEvent",
    "PUBLIC_NAMES",
)


# Reading these starts the device runtime on TorchTPU (they are compared by presence only).
NOT_READ = {"torch.tpu": ("default_generators",)}


def signature(obj: Any) -> str:
    """Parameter names, kinds and defaults; annotations left out (string vs evaluated forms differ)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(?)"
    parts, star_done = [], False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star_done = True
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        text = p.name
        if p.default is not p.empty:
            default = p.default
            text += "=" + (default.__name__ if isinstance(default, type) else repr(default))
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (
            p is list(sig.parameters.values())[-1]
            or list(sig.parameters.values())[list(sig.parameters.values()).index(p) + 1].kind is not p.POSITIONAL_ONLY
        ):
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def describe(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        if issubclass(obj, enum.Enum):
            return "enum[" + ", ".join(obj.__members__) + "]"
        init = obj.__init__ if obj.__init__ is not object.__init__ else obj
        sig = signature(init)
        if sig.startswith("(self, ") or sig == "(self)":
            sig = "(" + sig[len("(self, ") :] if sig != "(self)" else "()"
        return "class" + sig
    if callable(obj):
        return "function" + signature(obj)
    return "value:" + type(obj).__name__


def attempt(fn: Callable[[], Any]) -> str:
    """What calling ``fn`` does: its result's type, or the exception's type and first line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn()
        except BaseException as err:  # noqa: BLE001  (recording what happens is the point)
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            outcome = f"raises {type(err).__name__}: {first}"
        else:
            outcome = f"returns {type(result).__name__}"
    messages = sorted({str(w.message).split(" ")[0] for w in caught if str(w.message).startswith("<TorchTpu")})
    return outcome + (f" (warns {', '.join(messages)})" if messages else "")


def modules() -> dict[str, dict[str, str]]:
    import importlib

    import torch  # noqa: F401  (sets torch.tpu up: TorchTPU's autoload, or hf-tpu's)

    out: dict[str, dict[str, str]] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001
            out[name] = {"<import>": f"error {type(err).__name__}"}
            continue
        names: dict[str, str] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for attr in sorted(n for n in dir(module) if not n.startswith("_")):
                if attr in NOT_READ.get(name, ()):
                    names[attr] = "present (not read: starts the runtime)"
                    continue
                try:
                    names[attr] = describe(getattr(module, attr))
                except Exception as err:  # noqa: BLE001
                    names[attr] = f"error {type(err).__name__}"
        out[name] = names
    return out


def op_schemas() -> dict[str, str]:
    """Every operator in the ``tpu`` namespace (registered once the modules above were touched)."""
    import torch

    out = {}
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("tpu::"):
            continue
        op = qualified.split("::", 1)[1]
        name, _, overload = op.partition(".")
        packet = getattr(torch.ops.tpu, name)
        schema = getattr(packet, overload or "default")._schema
        out[qualified] = str(schema)
    return out


def behaviours() -> dict[str, str]:
    import torch
    import torch._dynamo
    import torch._functorch.config

    tpu = torch.tpu
    out = {
        "guard: torch.tpu.device_count()": attempt(lambda: tpu.device_count()),
        "guard: torch.tpu.current_device()": attempt(lambda: tpu.current_device()),
        "guard: torch.tpu.set_device(0)": attempt(lambda: tpu.set_device(0)),
        "guard: torch.tpu.synchronize()": attempt(lambda: tpu.synchronize()),
        "amp dtypes": attempt(lambda: None),
        "precision('bogus')": attempt(lambda: tpu.precision("bogus").__enter__()),
        "precision(3)": attempt(lambda: tpu.precision(3).__enter__()),
        "TpuProfilerConfig(bogus=1)": attempt(lambda: tpu.profiler.TpuProfilerConfig(bogus=1)),
        "TpuProfilerConfig()": attempt(lambda: tpu.profiler.TpuProfilerConfig()),
        "compile backend 'tpu' registered": str("tpu" in torch._dynamo.list_backends(exclude_tags=())),
        "dynamo allow_rnn": str(getattr(torch._dynamo.config, "allow_rnn", None)),
        "dynamo trace_autograd_ops": str(getattr(torch._dynamo.config, "trace_autograd_ops", None)),
        "functorch graphsafe_rng_functionalization": str(torch._functorch.config.graphsafe_rng_functionalization),
        "functorch functionalize_rng_ops": str(torch._functorch.config.functionalize_rng_ops),
    }
    from torch._functorch._aot_autograd import utils as aot_utils

    out["graph-safe RNG device types"] = str(sorted(getattr(aot_utils, "_GRAPHSAFE_RNG_DEVICE_TYPES", ())))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out["amp dtypes"] = ", ".join(str(d) for d in tpu.get_amp_supported_dtype())
        except Exception as err:  # noqa: BLE001
            out["amp dtypes"] = f"error {type(err).__name__}"
    for name in ABSENT:
        out[f"absent: torch.tpu.{name}"] = str(not hasattr(tpu, name))
    return out


def jax_op_schemas() -> dict[str, str]:
    """The op schema ``torch.tpu.pallas.jax_op`` derives from each kind of annotated JAX function (registering
    an op traces nothing and starts no runtime)."""
    import enum
    import functools
    from typing import Optional  # noqa: UP035  (the annotation users write)

    import jax
    import torch

    class Mode(enum.Enum):
        A = 1
        B = 2

    def scalar(x: jax.Array, n: int, s: float, b: bool, t: str) -> jax.Array: ...
    def union(x: jax.Array, s: int | float) -> jax.Array: ...  # noqa: E704
    def enum_(x: jax.Array, m: Mode) -> jax.Array: ...  # noqa: E704
    def device(x: jax.Array, d: torch.device) -> jax.Array: ...  # noqa: E704
    def keyword(x: jax.Array, *, n: int = 2) -> jax.Array: ...  # noqa: E704
    def optional_in(x: jax.Array, y: Optional[jax.Array]) -> jax.Array: ...  # noqa: E704, UP045
    def optional_out(x: jax.Array) -> Optional[jax.Array]: ...  # noqa: E704, UP045
    def none_out(x: jax.Array) -> None: ...  # noqa: E704
    def pair_out(x: jax.Array) -> tuple[jax.Array, jax.Array]: ...  # noqa: E704
    def ints(x: jax.Array, ns: list[int]) -> jax.Array: ...  # noqa: E704
    def arrays(xs: list[jax.Array]) -> jax.Array: ...  # noqa: E704
    def dtype(x: jax.Array, d: torch.dtype) -> jax.Array: ...  # noqa: E704
    def unannotated(x, n): ...  # noqa: ANN001, ANN202, E704

    functions = [scalar, union, enum_, device, keyword, optional_in, optional_out, none_out, pair_out, ints,
                 arrays, dtype, unannotated, functools.partial(scalar, t="x")]  # fmt: skip
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, fn in enumerate(functions):
            label = getattr(fn, "__name__", "partial")
            try:
                op = torch.tpu.pallas.jax_op(f"contract_probe::op{i}", fn)
            except Exception as err:  # noqa: BLE001
                out[label] = f"raises {type(err).__name__}"
                continue
            bases = [c.__name__ for c in type(op).__mro__ if c.__name__ == "CustomOpDef"]
            out[label] = f"{bases[0] if bases else type(op).__name__}: {op._opoverload._schema}"
    return out


def compile_option_errors() -> dict[str, str]:
    """The 'tpu' compile backend's answer to invalid options, which it checks before lowering anything."""
    import torch
    import torch._dynamo

    backend = torch._dynamo.lookup_backend("tpu")
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    example = [torch.ones(2)]
    cases = {
        "num_dynamic_buckets=0": {"options": {"num_dynamic_buckets": 0}},
        "num_dynamic_buckets=9": {"options": {"num_dynamic_buckets": 9}},
        "bucket_size=0": {"options": {"bucket_size": 0}},
        "bucket_size='x'": {"options": {"bucket_size": "x"}},
        "debug_callback=3": {"options": {"debug_callback": 3}},
    }
    out = {name: attempt(lambda kw=kw: backend(gm, example, **kw)) for name, kw in cases.items()}
    kind = attempt(lambda: backend(gm, example, mode="max-autotune"))
    out["mode='max-autotune'"] = kind.split(":")[0]  # the exception type (hf-tpu's message says what to do)
    out["TpuBackend"] = describe(type(backend))
    return out


def main() -> None:
    with contextlib.redirect_stdout(io.StringIO()):  # TorchTPU prints "libtpu not found." on import
        surface = {"modules": modules(), "ops": op_schemas(), "behaviours": behaviours()}
        surface["behaviours"].update({f"jax_op {k}": v for k, v in jax_op_schemas().items()})
        surface["behaviours"].update({f"compile {k}": v for k, v in compile_option_errors().items()})
    json.dump(surface, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
