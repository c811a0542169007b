"""``torch.tpu.optimizers`` for the emulated TPU: TorchTPU 0.2.0's functional optimizers and SingleTraceTrainer.

TorchTPU's optimizers are stateless: ``init_param_group(params)`` makes a ``ParamGroup`` (parameters plus
optimizer state, a pytree of tensors), ``step(param_group, grads)`` returns the updated group, and the
hyperparameters are fixed at construction (``defaults``), so a whole training step can be traced into one graph.
``SingleTraceTrainer`` does that: forward, loss, gradients and the optimizer step traced with ``make_fx`` into
one graph, compiled by ``compile_fn``. The constructors take TorchTPU's parameters (the contract test compares
them); the update rules are torch.optim's (AdamW, SGD, Muon), written out here so the moments can be bfloat16.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import math
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from torch.utils import _pytree

from hf_tpu.emulator.api_stage import warn_experimental


def _named(params: dict[str, torch.Tensor] | torch.nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(params, torch.nn.Module):
        return {name.replace(".", "_"): p.detach() for name, p in params.named_parameters()}
    return dict(params)


def _zeros(params: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(p, dtype=dtype, memory_format=torch.preserve_format) for k, p in params.items()}


def _steps(params: dict[str, torch.Tensor], start: float) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(start, dtype=torch.float32, device=p.device) for k, p in params.items()}


def _pytree_dataclass(cls: type) -> type:
    names = [f.name for f in dataclasses.fields(cls)]
    _pytree.register_pytree_node(
        cls, lambda g: ([getattr(g, n) for n in names], None), lambda children, _: cls(*children)
    )
    return cls


class Optimizer(abc.ABC):
    """Base of TorchTPU's functional optimizers: hyperparameters fixed at construction, state in a ParamGroup."""

    ParamGroup: ClassVar[Any]
    _HYPERPARAMETER_NAMES: ClassVar[tuple[str, ...]] = ("lr", "weight_decay")

    def __init__(self, lr: float = 1e-3, weight_decay: float = 0.0) -> None:
        warn_experimental(f"optimizers.{type(self).__name__}")
        self._lr, self._weight_decay = lr, weight_decay

    @property
    def defaults(self) -> Mapping[str, Any]:
        """The hyperparameters (read-only: they are constants of a traced step)."""
        return types.MappingProxyType({n: getattr(self, f"_{n}") for n in self._HYPERPARAMETER_NAMES})

    @abc.abstractmethod
    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> Any:
        """A fresh ParamGroup from a dict of parameters or a module (names with "." turned into "_")."""

    @abc.abstractmethod
    def step(self, param_group: Any, grads: dict[str, torch.Tensor]) -> Any:
        """Apply one update to ``param_group`` (in place) and return it."""

    def __call__(self, param_group: Any, grads: dict[str, torch.Tensor]) -> Any:
        return self.step(param_group, grads)


@_pytree_dataclass
@dataclasses.dataclass
class _AdamWParamGroup:
    params: dict[str, torch.Tensor]
    opt_state_m: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    opt_state_v: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    opt_steps: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


class AdamW(Optimizer):
    """AdamW (torch.optim.AdamW's rule: decoupled weight decay, bias correction); moments in bfloat16 by default."""

    ParamGroup = _AdamWParamGroup
    _HYPERPARAMETER_NAMES = ("lr", "weight_decay", "beta1", "beta2", "eps", "use_bfloat16_moments", "amsgrad",
                             "maximize", "foreach", "capturable", "differentiable", "fused", "grad_scale",
                             "found_inf")  # fmt: skip

    def __init__(
        self,
        lr: float = 1e-3,
        weight_decay: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        use_bfloat16_moments: bool = True,
        amsgrad: bool = False,
        maximize: bool = False,
        foreach: bool | None = False,
        capturable: bool = True,
        differentiable: bool = False,
        fused: bool | None = False,
        grad_scale: torch.Tensor | None = None,
        found_inf: torch.Tensor | None = None,
    ) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        if amsgrad:
            raise NotImplementedError("torch.tpu.optimizers.AdamW(amsgrad=True) is not emulated (no max state).")
        self._beta1, self._beta2, self._eps = beta1, beta2, eps
        self._use_bfloat16_moments, self._amsgrad, self._maximize = use_bfloat16_moments, amsgrad, maximize
        self._foreach, self._capturable, self._differentiable, self._fused = foreach, capturable, differentiable, fused
        self._grad_scale, self._found_inf = grad_scale, found_inf

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> _AdamWParamGroup:
        params = _named(params)
        dtype = torch.bfloat16 if self._use_bfloat16_moments else None
        return self.ParamGroup(params, _zeros(params, dtype), _zeros(params, dtype), _steps(params, 0.0))

    def step(self, param_group: _AdamWParamGroup, grads: dict[str, torch.Tensor]) -> _AdamWParamGroup:
        from hf_tpu.emulator import gaps

        for name, p in param_group.params.items():
            g = -grads[name] if self._maximize else grads[name]
            m = param_group.opt_state_m[name]
            if m.dtype != g.dtype and "adamw_bfloat16_moments" in gaps.reproduced():
                # torch.optim.adam's exp_avg.lerp_(grad, ...), which TorchTPU's AdamW calls
                dtype = str(m.dtype).removeprefix("torch.").replace("bfloat16", "BFloat16")
                raise RuntimeError(
                    f"expected dtype c10::{dtype} for `end` but got dtype {str(g.dtype).removeprefix('torch.')}"
                )
            m, v, t = param_group.opt_state_m[name], param_group.opt_state_v[name], param_group.opt_steps[name]
            t.add_(1.0)
            new_m = m.float() * self._beta1 + g.float() * (1 - self._beta1)
            new_v = v.float() * self._beta2 + g.float().square() * (1 - self._beta2)
            m.copy_(new_m)
            v.copy_(new_v)
            step_size = self._lr / (1 - self._beta1**t)
            denom = (new_v / (1 - self._beta2**t)).sqrt() + self._eps
            p.mul_(1 - self._lr * self._weight_decay)
            p.sub_((step_size * new_m / denom).to(p.dtype))
        return param_group


@_pytree_dataclass
@dataclasses.dataclass
class _MomentumParamGroup:
    params: dict[str, torch.Tensor]
    opt_state_m: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    opt_steps: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


class Sgd(Optimizer):
    """SGD with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's rule)."""

    ParamGroup = _MomentumParamGroup
    _HYPERPARAMETER_NAMES = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
                             "fused", "grad_scale", "found_inf", "has_sparse_grad")  # fmt: skip

    def __init__(
        self,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
        foreach: bool | None = False,
        fused: bool | None = True,
        grad_scale: torch.Tensor | None = None,
        found_inf: torch.Tensor | None = None,
        has_sparse_grad: bool = False,
    ) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        self._momentum, self._dampening, self._nesterov, self._maximize = momentum, dampening, nesterov, maximize
        self._foreach, self._fused, self._grad_scale, self._found_inf = foreach, fused, grad_scale, found_inf
        self._has_sparse_grad = has_sparse_grad

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> _MomentumParamGroup:
        params = _named(params)
        momentum = _zeros(params, None) if self._momentum != 0.0 else {}
        return self.ParamGroup(params, momentum, _steps(params, 1.0))

    def step(self, param_group: _MomentumParamGroup, grads: dict[str, torch.Tensor]) -> _MomentumParamGroup:
        for name, p in param_group.params.items():
            d = -grads[name] if self._maximize else grads[name]
            if self._weight_decay:
                d = d + self._weight_decay * p
            m, t = param_group.opt_state_m.get(name), param_group.opt_steps[name]
            if m is not None:
                # The first step's buffer is the gradient itself (torch.optim.SGD), later ones decay.
                m.copy_(torch.where(t == 1.0, d, self._momentum * m + (1 - self._dampening) * d))
                d = d + self._momentum * m if self._nesterov else m
            p.sub_(self._lr * d)
            t.add_(1.0)
        return param_group


def _orthogonalise(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration (torch.optim.Muon's): the nearest semi-orthogonal matrix to g."""
    a, b, c = coefficients
    x = g.bfloat16()
    tall = x.shape[0] > x.shape[1]
    x = x.mT if tall else x
    x = x / (x.norm() + eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(g.dtype)


class Muon(Optimizer):
    """Muon for 2-D parameters (torch.optim.Muon's rule: momentum, Newton-Schulz orthogonalisation)."""

    ParamGroup = _MomentumParamGroup
    _HYPERPARAMETER_NAMES = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                             "adjust_lr_fn", "use_bfloat16_moments", "foreach", "has_complex")  # fmt: skip

    def __init__(
        self,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        use_bfloat16_moments: bool = False,
        foreach: bool | None = False,
        has_complex: bool = False,
    ) -> None:
        super().__init__(lr=lr, weight_decay=weight_decay)
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ValueError(f"adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}.")
        self._momentum, self._nesterov, self._ns_coefficients = momentum, nesterov, ns_coefficients
        self._eps, self._ns_steps, self._adjust_lr_fn = eps, ns_steps, adjust_lr_fn
        self._use_bfloat16_moments, self._foreach, self._has_complex = use_bfloat16_moments, foreach, has_complex

    def init_param_group(self, params: dict[str, torch.Tensor] | torch.nn.Module) -> _MomentumParamGroup:
        params = _named(params)
        dtype = torch.bfloat16 if self._use_bfloat16_moments else None
        return self.ParamGroup(params, _zeros(params, dtype), _steps(params, 0.0))

    def _lr_for(self, shape: torch.Size) -> float:
        rows, cols = shape[:2]
        if self._adjust_lr_fn == "match_rms_adamw":
            return self._lr * 0.2 * math.sqrt(max(rows, cols))
        return self._lr * math.sqrt(max(1.0, rows / cols))

    def step(self, param_group: _MomentumParamGroup, grads: dict[str, torch.Tensor]) -> _MomentumParamGroup:
        for name, p in param_group.params.items():
            g, m = grads[name], param_group.opt_state_m[name]
            new_m = m.float().lerp(g.float(), 1 - self._momentum)
            m.copy_(new_m)
            update = g.float().lerp(new_m, self._momentum) if self._nesterov else new_m
            update = _orthogonalise(update, self._ns_coefficients, self._ns_steps, self._eps)
            p.mul_(1 - self._lr * self._weight_decay)
            p.sub_((self._lr_for(p.shape) * update).to(p.dtype))
            param_group.opt_steps[name].add_(1.0)
        return param_group


def _loss(model: torch.nn.Module, names: dict[str, str], params: dict[str, torch.Tensor],
          buffers: dict[str, torch.Tensor], inputs: Any, targets: Any,
          compute_loss_fn: Callable[..., torch.Tensor] | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
    """TorchTPU's loss rules: ``compute_loss_fn(model, args, kwargs)``; else MSE against ``targets``; else the
    output's ``loss``, else the mean of its ``logits`` / ``sample`` / first tensor."""
    from torch.func import functional_call
    from torch.nn.utils import stateless

    named = {names[k]: v for k, v in params.items()} | {names[k]: v for k, v in buffers.items()}
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else ((tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((inputs,), {}))  # fmt: skip
    if compute_loss_fn is not None:
        with stateless._reparametrize_module(model, named, tie_weights=True):
            return compute_loss_fn(model, args, kwargs), buffers
    out = functional_call(model, named, args, kwargs)
    if targets is not None:
        return torch.nn.functional.mse_loss(out, targets), buffers
    for field in ("loss", "logits", "sample"):
        value = out.get(field) if isinstance(out, dict) else getattr(out, field, None)
        if value is not None:
            return (value if field == "loss" else value.mean()), buffers
    tensors = [t for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise TypeError(f"Cannot extract loss from output of type {type(out)}")
    return tensors[0].mean(), buffers


def _call_compile_fn(compile_fn: Callable[..., Any], gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
    """``compile_fn(gm, example_inputs)``, or ``compile_fn(gm)`` when it takes one positional argument."""
    try:
        params = list(inspect.signature(compile_fn).parameters.values())
    except (TypeError, ValueError):
        return compile_fn(gm, inputs)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) == 1 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        return compile_fn(gm)
    return compile_fn(gm, inputs)


class SingleTraceTrainer:
    """A training step (forward, loss, gradients, optimizer step) traced into one graph and compiled once.

    ``optimizer=None``: the step computes gradients only and stores them in each ``param.grad``."""

    def __init__(self, model: torch.nn.Module, optimizer: Any = None, compile_fn: Callable[..., Any] | None = None,
                 compute_loss_fn: Callable[..., torch.Tensor] | None = None) -> None:  # fmt: skip
        warn_experimental("optimizers.SingleTraceTrainer")
        self._model, self._optimizer = model, optimizer
        self._compile_fn, self._compute_loss_fn = compile_fn, compute_loss_fn
        if callable(getattr(model, "tie_weights", None)):
            model.tie_weights()
        self._names: dict[str, str] = {}
        params: dict[str, torch.Tensor] = {}
        for name, p in model.named_parameters():
            self._names[name.replace(".", "_")] = name
            params[name.replace(".", "_")] = p.detach()
        self._buffers: dict[str, torch.Tensor] = {}
        for name, b in model.named_buffers():
            self._names[name.replace(".", "_")] = name
            self._buffers[name.replace(".", "_")] = b.detach()
        self._param_group = optimizer.init_param_group(params) if optimizer is not None else params

    @property
    def param_group(self) -> Any:
        """The parameters and optimizer state the step updates (the optimizer's ParamGroup, or a dict)."""
        return self._param_group

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """The parameters under their original names."""
        group = getattr(self._param_group, "params", self._param_group)
        return {self._names[k]: v for k, v in group.items()}

    def make_compiled_train_step(self, example_inputs: Any, example_targets: Any = None,
                                 compile_fn: Callable[..., Any] | None = None) -> Callable[..., torch.Tensor]:  # fmt: skip
        """Trace and compile the step for inputs like ``example_inputs``; returns ``step(inputs, targets=None)``."""
        from torch.func import grad_and_value
        from torch.fx.experimental.proxy_tensor import make_fx

        compile_fn = compile_fn or self._compile_fn
        if compile_fn is None:
            raise ValueError(
                "A compilation callback (compile_fn) must be provided either to SingleTraceTrainer or to "
                "make_compiled_train_step."
            )
        with_targets = example_targets is not None
        flat, spec = _pytree.tree_flatten(
            (self._param_group, self._buffers, example_inputs) + ((example_targets,) if with_targets else ())
        )
        out_spec: list[Any] = [None]

        def step(*flat_args: Any) -> tuple[Any, ...]:
            group, buffers, inputs, *rest = _pytree.tree_unflatten(list(flat_args), spec)
            targets = rest[0] if rest else None
            params = getattr(group, "params", group)

            def loss_of(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> Any:
                return _loss(self._model, self._names, p, b, inputs, targets, self._compute_loss_fn)

            grads, (loss, buffers) = grad_and_value(loss_of, has_aux=True)(params, buffers)
            result = (loss, self._optimizer(group, grads) if self._optimizer is not None else grads, buffers)
            leaves, out_spec[0] = _pytree.tree_flatten(result)
            return tuple(leaves)

        graph = make_fx(step, tracing_mode="fake")(*flat)
        compiled = _call_compile_fn(compile_fn, graph, flat)

        def train_step(inputs: Any, targets: Any = None) -> torch.Tensor:
            if (targets is None) == with_targets:
                raise ValueError("Pass targets to the step exactly when example_targets were given.")
            args = _pytree.tree_leaves(
                (self._param_group, self._buffers, inputs) + ((targets,) if with_targets else ())
            )
            loss, second, self._buffers = _pytree.tree_unflatten(list(compiled(*args)), out_spec[0])
            if self._optimizer is not None:
                self._param_group = second
            else:
                for name, p in self._model.named_parameters():
                    p.grad = second.get(name.replace(".", "_"))
            self._model.load_state_dict({self._names[k]: v for k, v in self._buffers.items()}, strict=False)
            return loss

        return train_step


def build_module() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.optimizers", "Public optimizers API for TorchTPU (`torch.tpu.optimizers`).")
    for cls in (AdamW, Muon, Optimizer, Sgd, SingleTraceTrainer):
        setattr(mod, cls.__name__, cls)
    mod.__all__ = ["AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer"]
    return mod
