# ruff: noqa: N999  (kernels names the variant directory torch-tpu)
"""ragged-dot-tpu: transformers MoE experts as one ragged-dot op per layer on TPU (hf-tpu's build).

Same contract as ``kernels-community/ragged-dot-tpu`` (``experts_forward(self, hidden_states, top_k_index,
top_k_weights)``), plus what that kernel refuses: transposed weights, biases, custom gates (gpt_oss), no gate.

Backends, one algorithm (one JAX function per layer through ``torch.tpu.pallas.jax_op``):
- real TPU: ``tokamax.ragged_dot_general`` with ``mosaic_tpu_v2`` (tokamax >= 0.0.13, Python >= 3.12), else the
  v1 ``mosaic`` kernel when every non-expert dimension (T*k included) is >= 128, else ``xla``;
- emulated TPU: the same JAX function on CPU with ``"grouped"`` ragged dots (a per-(expert, row tile) loop in
  plain XLA: XLA:CPU lowers ``ragged_dot`` densely over all groups, 12x slower at 512 rows x 64 experts);
  ``HF_TPU_RAGGED_DOT_IMPLEMENTATION=xla`` (or setting ``IMPLEMENTATION``) runs tokamax's ``xla`` instead, or
  ``jax.lax.ragged_dot_general`` (what it runs) without tokamax; without jax, a pure-torch ``grouped_mm`` path;
- CPU tensors: the torch path.

jax and tokamax are imported here, not declared in ``metadata.json``: kernels has no TPU ``python-depends``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any

import torch

from . import _torch_impl
from ._ops import add_op_namespace_prefix

__all__ = ["choose_implementation", "experts_forward", "ragged_dot"]

EXTRA_HINT = "pip install 'hf-tpu[tpu]' (torch-tpu, jax, tokamax)"
_ACTIVATION_NAMES = {
    "SiLUActivation": "silu",
    "SiLU": "silu",
    "GELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
    "GELUActivation": "gelu",
    "ReLU": "relu",
}
_V2_MIN = (0, 0, 13)  # first tokamax with mosaic_tpu_v2 (it needs Python >= 3.12)
_V1_MIN_DIM = 128  # tokamax's v1 "mosaic" kernel refuses any non-expert dimension under 128 (decode: T*k < 128)


def _probe() -> dict[str, Any]:
    """What this process has, resolved at import (kernels loads a torch-tpu build only once a TPU is up), so
    nothing here runs inside a torch.compile trace."""
    try:  # hf-tpu's public answer: a CPU-backed emulated chip cannot run Pallas TPU kernels
        import hf_tpu

        emulated = hf_tpu.backend() == "emulated"
    except ImportError:  # this build loaded without hf-tpu: a real TPU
        emulated = False
    version = None
    if importlib.util.find_spec("tokamax") is not None:
        from packaging.version import Version

        version = Version(importlib.metadata.version("tokamax")).release
    return {
        "emulated": emulated,
        "has_jax": importlib.util.find_spec("jax") is not None,
        "tokamax_version": version,
    }


_ENV = _probe()
# Force a ragged-dot implementation (e.g. "xla" on the emulator to run what tokamax's XLA path runs).
IMPLEMENTATION: str | None = os.environ.get("HF_TPU_RAGGED_DOT_IMPLEMENTATION") or None
IMPLEMENTATIONS = ("mosaic_tpu_v2", "mosaic", "xla", "lax", "grouped")
_OPS: dict[str, Any] = {}  # the jax_ops, registered on first use


def choose_implementation(
    m: int, k: int, n: int, *, emulated: bool, tokamax_version: tuple[int, ...] | None, forced: str | None = None
) -> str:
    """The ragged-dot implementation for ``[m, k] x [G, k, n]``: a tokamax name, ``"lax"`` (``jax.lax``, what
    tokamax's ``"xla"`` runs, when tokamax is absent) or ``"grouped"`` (a per-group loop in plain XLA)."""
    if forced:
        if forced not in IMPLEMENTATIONS:
            raise ValueError(
                f"HF_TPU_RAGGED_DOT_IMPLEMENTATION={forced!r} (or IMPLEMENTATION) is not one of "
                f"{', '.join(IMPLEMENTATIONS)}; unset it to let the kernel choose."
            )
        return "lax" if forced == "xla" and tokamax_version is None else forced
    if emulated:  # Pallas TPU kernels cannot run on a CPU host, and XLA:CPU's ragged_dot is dense over groups
        return "grouped"
    if tokamax_version is None:
        raise ImportError(f"ragged-dot-tpu needs tokamax on a TPU: {EXTRA_HINT}.")
    if tokamax_version >= _V2_MIN:
        return "mosaic_tpu_v2"
    if min(m, k, n) >= _V1_MIN_DIM:
        return "mosaic"
    return "xla"


def _require_jax() -> Any:
    try:
        from . import _jax_impl
    except ImportError as err:
        raise ImportError(f"ragged-dot-tpu needs jax on a TPU ({err}): {EXTRA_HINT}.") from err
    return _jax_impl


def _ops() -> dict[str, Any]:
    """Register the jax_ops once per loaded copy (their names carry this build's namespace)."""
    if not _OPS:
        impl = _require_jax()
        if not _ENV["emulated"]:
            import jax

            # TorchTPU cannot compile chlo.ragged_dot (tokamax's torch wrappers set the same flag).
            jax.config.update("jax_ragged_dot_use_ragged_dot_instruction", False)
        if _ENV["tokamax_version"] is not None:
            from absl import flags

            # tokamax reads its config through absl flags and, if they are unparsed, parses sys.argv on first use:
            # any script with its own CLI options (pytest -q, --port ...) dies with UnrecognizedFlagError.
            if not flags.FLAGS.is_parsed():
                flags.FLAGS.mark_as_parsed()
        jax_op = torch.tpu.pallas.jax_op
        for name in ("experts", "experts_up", "experts_down", "ragged_dot"):
            _OPS[name] = jax_op(add_op_namespace_prefix(name), getattr(impl, name))
        for name in ("experts", "experts_up", "experts_down"):  # training: each forward paired with its VJP
            backward = jax_op(add_op_namespace_prefix(f"{name}_backward"), getattr(impl, f"{name}_backward"))
            _register_autograd(_OPS[name], backward, name)
    return _OPS


# Positions of the differentiable inputs of each forward op, and which backward outputs they receive.
_GRAD_INPUTS = {
    "experts": (0, 2, 3, 4, 5, 6),  # hidden, weights, w_up, w_down, b_up, b_down
    "experts_up": (0, 2, 3),  # hidden, w_up, b_up
    "experts_down": (0, 2, 4, 5),  # x, weights, w_down, b_down
}


def _register_autograd(forward: Any, backward: Any, name: str) -> None:
    """Gradients through the jax_op ``forward`` come from the jax_op ``backward`` (its VJP, one op per layer)."""
    positions = _GRAD_INPUTS[name]

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.num_inputs = len(inputs)
        ctx.tensor_positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_positions))
        ctx.statics = {i: x for i, x in enumerate(inputs) if not isinstance(x, torch.Tensor)}

    def grad_fn(ctx: Any, *grads: Any) -> tuple:
        inputs: list[Any] = [None] * ctx.num_inputs
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            inputs[i] = t
        for i, x in ctx.statics.items():
            inputs[i] = x
        grad = grads[0]  # experts_up's second output (the sort order) has no gradient
        outs = backward(grad.contiguous(), *inputs)
        result: list[Any] = [None] * ctx.num_inputs
        for i, g in zip(positions, outs, strict=True):
            result[i] = g if inputs[i] is not None else None
        return tuple(result)

    forward.register_autograd(grad_fn, setup_context=setup_context)


def _backend(device: torch.device) -> str:
    if device.type != "tpu":
        return "torch"
    return "torch" if _ENV["emulated"] and not _ENV["has_jax"] else "jax"


def _impl(m: int, k: int, n: int) -> str:
    return choose_implementation(
        m, k, n, emulated=_ENV["emulated"], tokamax_version=_ENV["tokamax_version"], forced=IMPLEMENTATION
    )


def _model_name(module: torch.nn.Module) -> str:
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    return f"{model_type} ({type(module).__name__})" if model_type else type(module).__name__


def _layout(module: torch.nn.Module) -> dict[str, Any]:
    """Weights and flags of a transformers experts module; an error names the flag and model it cannot honour."""
    name = _model_name(module)
    if getattr(module, "has_post_expert_norm", False):
        raise NotImplementedError(
            f"ragged-dot-tpu: {name} has has_post_expert_norm=True (a norm between the down projection and the "
            "routing weights), which this kernel does not implement. Use experts_implementation='grouped_mm'."
        )
    has_gate = getattr(module, "has_gate", True)
    has_bias = getattr(module, "has_bias", False)
    up_name = "gate_up_proj" if has_gate else "up_proj"
    if not hasattr(module, up_name) or not hasattr(module, "down_proj"):
        raise NotImplementedError(
            f"ragged-dot-tpu: {name} has has_gate={has_gate} but no {up_name}/down_proj expert weights."
        )
    if has_bias and not hasattr(module, f"{up_name}_bias"):
        raise NotImplementedError(f"ragged-dot-tpu: {name} has has_bias=True but no {up_name}_bias.")
    apply_gate = getattr(type(module), "_apply_gate", None)
    custom_gate = has_gate and (
        not getattr(module, "is_concatenated", True) or getattr(apply_gate, "__name__", "") != "_default_apply_gate"
    )
    act_fn = getattr(module, "act_fn", None)
    activation = _ACTIVATION_NAMES.get(type(act_fn).__name__)
    return {
        "w_up": getattr(module, up_name),
        "w_down": module.down_proj,
        "b_up": getattr(module, f"{up_name}_bias") if has_bias else None,
        "b_down": module.down_proj_bias if has_bias else None,
        "has_gate": has_gate,
        "transposed": bool(getattr(module, "is_transposed", False)),
        "activation": None if custom_gate else activation,  # None: the gate runs in torch between two ops
        "act_fn": act_fn,
        "custom_gate": custom_gate,
    }


def _torch_gate(module: torch.nn.Module, layout: dict[str, Any]) -> Any:
    if layout["custom_gate"]:
        return module._apply_gate
    act_fn = layout["act_fn"]
    if layout["has_gate"]:

        def gate(y: torch.Tensor) -> torch.Tensor:
            g, up = y.chunk(2, dim=-1)
            return act_fn(g.float()).to(y.dtype) * up  # activation in f32, rounded once

        return gate
    return lambda y: act_fn(y.float()).to(y.dtype)


def experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' experts contract: ``[T, H]``, ``[T, k]`` ids (EP sentinel = local expert count), ``[T, k]``
    routing weights -> ``[T, H]`` in ``hidden_states.dtype``. One op per layer when the gate is a known one."""
    layout = _layout(self)
    w_up, w_down, b_up, b_down = layout["w_up"], layout["w_down"], layout["b_up"], layout["b_down"]
    transposed = layout["transposed"]
    if _backend(hidden_states.device) == "torch":
        gate = _torch_gate(self, layout)
        return _torch_impl.experts(
            hidden_states, top_k_index, top_k_weights, w_up, w_down, b_up, b_down, gate, transposed
        )

    ops = _ops()
    ids = top_k_index.int()  # jax_op traces with 32-bit ints; the router's topk ids are int64
    m = top_k_index.numel()
    in_dim, up_dim = (w_up.shape[1], w_up.shape[2]) if transposed else (w_up.shape[2], w_up.shape[1])
    mid_dim, out_dim = (w_down.shape[1], w_down.shape[2]) if transposed else (w_down.shape[2], w_down.shape[1])
    impl_up, impl_down = _impl(m, in_dim, up_dim), _impl(m, mid_dim, out_dim)
    if layout["activation"] is not None:
        return ops["experts"](
            hidden_states,
            ids,
            top_k_weights,
            w_up,
            w_down,
            b_up,
            b_down,
            layout["activation"],
            layout["has_gate"],
            transposed,
            impl_up,
            impl_down,
        )
    y, perm = ops["experts_up"](hidden_states, ids, w_up, b_up, transposed, impl_up)
    x = _torch_gate(self, layout)(y)
    out_dtype = str(hidden_states.dtype).removeprefix("torch.")
    return ops["experts_down"](x, ids, top_k_weights, perm, w_down, b_down, transposed, impl_down, out_dtype)


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """``lhs[M, K] x rhs[G, N, K] -> [M, N]``: rows in contiguous groups of ``group_sizes`` times ``rhs[g].T``."""
    if _backend(lhs.device) == "torch":
        offsets = torch.cumsum(group_sizes, 0, dtype=torch.int32)
        out = _torch_impl._grouped(lhs, rhs, offsets, False)
        rows = torch.arange(lhs.shape[0], device=lhs.device)[:, None]
        return torch.where(rows < offsets[-1], out, 0)
    return _ops()["ragged_dot"](lhs, rhs, group_sizes.int(), _impl(lhs.shape[0], lhs.shape[1], rhs.shape[1]))
