"""Plans as data: the registry, the validator and the derivation helper.

Nothing here imports transformers or diffusers; the library hooks (``transformers.py``,
``diffusers.py``) call these functions with the model they are loading.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

# Styles whose shard feeds a paired layer on the same rank: the sharded dim must divide by N.
# (Styles that gather or reduce their output, e.g. ``colwise_gather_output`` on a vocab, may be uneven upstream.)
_COLWISE = {"colwise", "packed_colwise"}
_ROWWISE = {"rowwise", "packed_rowwise"}
_GATHERED = {"colwise_gather_output", "colwise_rep", "rowwise_rep", "rowwise_split_input"}
_EMBEDDING = {"embedding_rowwise": 0, "embedding_colwise": 1}
# Styles that keep every weight whole (or only hook the forward).
_WHOLE = {"replicate", "replicated_with_grad_allreduce", "local_params", "all_reduce", "sequence_parallel"}
# Attributes that count attention heads; a colwise-sharded projection under a module with one of these
# needs the count to divide by N, or a rank would hold part of a head.
HEAD_ATTRS = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads", "n_heads", "heads")


class PlanError(ValueError):
    """A tensor-parallel plan does not fit a model: a rule matches nothing, or a number does not divide by N."""


def generic_name(name: str) -> str:
    """``layers.3.mlp`` -> ``layers.*.mlp``: the way transformers and diffusers write plan keys."""
    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


def _keys(name: str) -> tuple[str, ...]:
    """The ways a plan may spell ``name``: literal, every number as ``*`` (transformers), only the first number
    as ``*`` (diffusers, whose plans allow one wildcard)."""
    first = re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name, count=1)
    return (name, generic_name(name), first)


def _style_name(style: Any) -> str:
    """Plan values are strings, or diffusers' ``PackedColwiseParallel`` / ``PackedRowwiseParallel`` markers."""
    if isinstance(style, str):
        return str.__str__(style)
    kind = type(style).__name__
    return {"PackedColwiseParallel": "packed_colwise", "PackedRowwiseParallel": "packed_rowwise"}.get(kind, kind)


class IfPresent(str):
    """A plan style for a module that some blocks lack (SD3's last block has no ``to_add_out``): the rule
    applies where the module exists instead of failing on the blocks without it."""

    __slots__ = ()


@dataclass(frozen=True)
class TPPlan:
    """A tensor-parallel plan for one model class, with what sharding changes beyond the weights.

    Attributes:
        plan: rules relative to a module of the class (``"layers.*.self_attn.q_proj": "colwise"``).
        per_rank: module pattern -> attributes that count heads and must become the per-rank count once the
            projections are sharded (OPT's attention reshapes with ``self.num_heads``).
        replicated: module prefixes left whole on purpose (small towers, norms): documentation, and the
            coverage check accepts them.
        why: one line for the plan table (docs/tensor-parallel.md).
    """

    plan: Mapping[str, Any]
    per_rank: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    replicated: tuple[str, ...] = ()
    why: str = ""

    def for_module(self, module: nn.Module) -> dict[str, Any]:
        """The rules that match something in ``module`` (a template covers encoder and decoder stacks, gated and
        plain MLPs; an instance has only some of them)."""
        names = {k for n, _ in (*module.named_modules(), *module.named_parameters()) for k in _keys(n)}
        return {k: v for k, v in self.plan.items() if k in names}


_REGISTRY: dict[str, TPPlan] = {}


def _key(model_class: type | str) -> str:
    return model_class if isinstance(model_class, str) else model_class.__name__


def register(model_class: type | str, plan: TPPlan | Mapping[str, Any], *, overwrite: bool = False) -> None:
    """Register a plan for a model class (or its name), applied when a model of that class ships none."""
    key = _key(model_class)
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"a tensor-parallel plan for {key} is already registered; pass overwrite=True to replace it")
    _REGISTRY[key] = plan if isinstance(plan, TPPlan) else TPPlan(plan=dict(plan))


def get(model_class: type | str) -> TPPlan | None:
    """The registered plan for ``model_class`` (exact class name), or None."""
    return _REGISTRY.get(_key(model_class))


def registered() -> dict[str, TPPlan]:
    """A copy of the registry: class name -> plan."""
    return dict(_REGISTRY)


def plan_for(model: nn.Module, *, skip: Callable[[str, nn.Module], bool] | None = None) -> dict[str, Any]:
    """The registry's rules for every registered submodule of ``model``, prefixed with its name.

    ``skip(name, module)`` returns True for submodules that already have a plan of their own.
    """
    out: dict[str, Any] = {}
    for name, module in model.named_modules():
        entry = get(type(module))
        if entry is None or (skip is not None and skip(name, module)):
            continue
        prefix = f"{generic_name(name)}." if name else ""
        for key, style in entry.for_module(module).items():
            out.setdefault(prefix + key, style)
    return out


def per_rank_attrs(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """``(name, module, attribute)`` for every head-count attribute the registry says becomes per-rank."""
    found = []
    for name, module in model.named_modules():
        entry = get(type(module))
        if entry is None or not entry.per_rank:
            continue
        for sub_name, sub in module.named_modules():
            for pattern, attrs in entry.per_rank.items():
                if pattern in _keys(sub_name):
                    full = f"{name}.{sub_name}" if name else sub_name
                    found.extend((full, sub, attr) for attr in attrs if hasattr(sub, attr))
    return found


def divide_heads(model: nn.Module, tp_size: int) -> list[str]:
    """Turn the registry's head-count attributes into per-rank counts (after the projections are sharded)."""
    changed = []
    for name, module, attr in per_rank_attrs(model):
        value = getattr(module, attr)
        if value % tp_size:
            raise PlanError(f"{name}.{attr}={value} is not divisible by tp_size={tp_size}")
        setattr(module, attr, value // tp_size)
        changed.append(f"{name}.{attr}")
    return changed


# ---- validation ------------------------------------------------------------------------------------
@dataclass
class PlanReport:
    """What a plan does to a model: which weights shard on which dim, which stay whole, and their bytes."""

    sharded: dict[str, tuple[str, int]] = field(default_factory=dict)  # param -> (style, dim)
    replicated: list[str] = field(default_factory=list)
    sharded_bytes: int = 0
    replicated_bytes: int = 0

    def bytes_per_chip(self, tp_size: int) -> float:
        """Weight bytes one chip holds: its slice of the sharded weights plus every replicated one."""
        return self.sharded_bytes / tp_size + self.replicated_bytes


def _match(plan: Mapping[str, Any], name: str) -> tuple[str, Any] | None:
    """Plans use ``*`` for layer numbers; an expanded plan (transformers' resolved one) names each layer."""
    for key in _keys(name):
        if key in plan:
            return key, plan[key]
    return None


def _param_style(plan: Mapping[str, Any], module_name: str, param_name: str) -> tuple[str, Any] | None:
    full = f"{module_name}.{param_name}" if module_name else param_name
    return _match(plan, full) or _match(plan, module_name)


def _shard_dim(style: str, param_name: str, ndim: int) -> int | None:
    """The dim a style shards a parameter on (None: kept whole), as transformers/diffusers do."""
    if style in _COLWISE or style in ("colwise_gather_output", "colwise_rep"):
        return max(ndim - 2, 0)
    if style in _ROWWISE or style in ("rowwise_rep", "rowwise_split_input"):
        return None if param_name == "bias" else ndim - 1
    if style in _EMBEDDING:
        return _EMBEDDING[style]
    return None


def _heads_of(module: nn.Module) -> dict[str, int]:
    heads = {a: getattr(module, a) for a in HEAD_ATTRS if isinstance(getattr(module, a, None), int)}
    config = getattr(module, "config", None) if "attention" in type(module).__name__.lower() else None
    for attr in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(config, attr, None) if config is not None else None
        if isinstance(value, int) and attr not in heads:
            heads[attr] = value
    return heads


def validate_plan(
    model: nn.Module,
    plan: Mapping[str, Any],
    tp_size: int,
    *,
    replicated_ok: Iterable[str] | None = None,
) -> PlanReport:
    """Check ``plan`` against ``model`` for ``tp_size`` chips before any weight is read (a meta model works;
    give it the unsharded model: sharding turns registry head counts into per-rank ones).

    Raises :class:`PlanError` naming the module and the number when a rule matches nothing, a sharded dim or
    a head count does not divide by ``tp_size``, or (with ``replicated_ok``) a matrix is neither sharded nor
    under one of the ``replicated_ok`` prefixes.
    """
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(
            f"validate_plan: tp_size={tp_size!r} must be a positive int, the number of chips the model is sharded "
            "over (e.g. torch.accelerator.device_count() or WORLD_SIZE)."
        )
    plan = {k: v for k, v in plan.items()}
    names = {k for n, _ in (*model.named_modules(), *model.named_parameters()) for k in _keys(n)}
    errors: list[str] = []
    if unknown := sorted(set(plan) - names):
        errors.append(f"rules {unknown} match nothing in {type(model).__name__}")
    report = PlanReport()
    sharded_parents: set[str] = set()
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            nbytes = param.numel() * param.element_size()
            hit = _param_style(plan, module_name, param_name)
            style = _style_name(hit[1]) if hit else None
            dim = _shard_dim(style, param_name, param.ndim) if style else None
            if dim is None:
                report.replicated.append(full)
                report.replicated_bytes += nbytes
                continue
            report.sharded[full] = (style, dim)
            report.sharded_bytes += nbytes
            size = param.shape[dim]
            blocks = 2 if style.startswith("packed") else 1
            blocks_attr = "_tp_packed_col_blocks" if style == "packed_colwise" else "_tp_packed_row_blocks"
            if not isinstance(hit[1], str) and getattr(hit[1], "blocks", None):
                blocks = sum(hit[1].blocks)
            elif getattr(module, blocks_attr, None):
                blocks = 1  # absolute block sizes: each must divide
                for block in getattr(module, blocks_attr):
                    if block % tp_size:
                        errors.append(
                            f"{generic_name(full)}: a packed block of {block} is not divisible by tp_size={tp_size}"
                        )
            if style in _GATHERED or style in _EMBEDDING:
                continue  # the output is gathered or reduced: upstream accepts an uneven last shard
            if size % (tp_size * blocks):
                what = f"{size} / {blocks} blocks" if blocks > 1 else str(size)
                errors.append(f"{generic_name(full)}: dim {dim} of size {what} is not divisible by tp_size={tp_size}")
            if style in _COLWISE and param_name == "weight":
                sharded_parents.add(module_name.rpartition(".")[0])
    for parent in sorted(sharded_parents):
        module = model.get_submodule(parent) if parent else model
        for attr, value in _heads_of(module).items():
            if value % tp_size:
                where = generic_name(parent) or type(model).__name__
                errors.append(f"{where}: {attr}={value} is not divisible by tp_size={tp_size}")
    if replicated_ok is not None:
        prefixes = tuple(replicated_ok)
        loose = [
            n
            for n in report.replicated
            if model.get_parameter(n).ndim >= 2 and not any(generic_name(n).startswith(p) for p in prefixes)
        ]
        if loose:
            errors.append(
                f"weights neither sharded nor listed as replicated: {loose[:8]}{' …' if len(loose) > 8 else ''}"
            )
    if errors:
        raise PlanError(
            f"tensor-parallel plan for {type(model).__name__} with tp_size={tp_size}: "
            + "; ".join(dict.fromkeys(errors))
        )
    return report


# ---- derivation ------------------------------------------------------------------------------------
_COL_NAMES = {
    "q_proj", "k_proj", "v_proj", "query", "key", "value", "to_q", "to_k", "to_v", "add_q_proj", "add_k_proj",
    "add_v_proj", "q", "k", "v", "gate_proj", "up_proj", "fc1", "fc_in", "w1", "w3", "wi", "wi_0", "wi_1",
    "dense_h_to_4h", "c_fc", "proj_mlp",
}  # fmt: skip
_ROW_NAMES = {
    "o_proj", "out_proj", "to_out.0", "to_add_out", "down_proj", "fc2", "fc_out", "w2", "wo", "o",
    "dense_4h_to_h", "net.2",
}  # fmt: skip
_FUSED_NAMES = {"qkv", "qkv_proj", "query_key_value", "c_attn", "Wqkv", "gate_up_proj"}


@dataclass
class DerivedPlan:
    """A proposal from :func:`derive_plan`: check it with :func:`validate_plan` before trusting it."""

    plan: dict[str, str]
    per_rank: dict[str, tuple[str, ...]]
    unsure: list[str]  # linear layers left whole because the name says nothing (or a fused projection)

    def as_tp_plan(self, why: str = "derived") -> TPPlan:
        return TPPlan(plan=self.plan, per_rank=self.per_rank, why=why)


def _linear_like(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ in ("Conv1D", "LoRACompatibleLinear")


def _first_index_generic(name: str) -> str:
    """``blocks.3.ff.net.0.proj`` -> ``blocks.*.ff.net.0.proj``: diffusers plans allow one ``*`` (the blocks)."""
    return _keys(name)[2]


def derive_plan(model: nn.Module) -> DerivedPlan:
    """Propose a plan from module names: q/k/v/gate/up colwise, o/down rowwise, the rest (embeddings, norms,
    anything unnamed) whole. A pair is proposed only where a block has both halves, so every colwise
    shard meets a rowwise layer that reduces it on the same rank. Keys follow the model's library:
    transformers matches every number as ``*``, diffusers allows one ``*`` (the block index)."""
    is_diffusers = type(model).__module__.startswith("diffusers")
    to_key = _first_index_generic if is_diffusers else generic_name
    by_parent: dict[str, dict[str, str]] = {}
    unsure: list[str] = []
    for name, module in model.named_modules():
        if not _linear_like(module):
            continue
        key = to_key(name)
        parts = key.split(".")
        leaf, two = parts[-1], ".".join(name.split(".")[-2:])
        if type(module).__name__ == "Conv1D" or leaf in _FUSED_NAMES:
            unsure.append(key)
        elif leaf in _COL_NAMES:
            by_parent.setdefault(".".join(parts[:-1]), {})[key] = "colwise"
        elif leaf in _ROW_NAMES:
            by_parent.setdefault(".".join(parts[:-1]), {})[key] = "rowwise"
        elif two in _ROW_NAMES:  # `to_out.0`, `net.2`: the block that owns the container
            by_parent.setdefault(".".join(parts[:-2]).removesuffix(".net"), {})[key] = "rowwise"
        elif name.endswith("net.0.proj"):  # diffusers FeedForward: GELU(proj) -> net.2
            by_parent.setdefault(".".join(parts[:-3]), {})[key] = "colwise"
        else:
            unsure.append(key)
    plan: dict[str, str] = {}
    per_rank: dict[str, tuple[str, ...]] = {}
    for parent, rules in by_parent.items():
        styles = set(rules.values())
        if styles != {"colwise", "rowwise"}:
            unsure.extend(sorted(rules))
            continue
        plan.update(rules)
        module = _first_instance(model, parent, to_key)
        attrs = tuple(a for a in HEAD_ATTRS if isinstance(getattr(module, a, None), int)) if module else ()
        if attrs:
            per_rank[parent] = attrs
    return DerivedPlan(plan=dict(sorted(plan.items())), per_rank=per_rank, unsure=sorted(set(unsure)))


def _first_instance(model: nn.Module, pattern: str, to_key: Callable[[str], str]) -> nn.Module | None:
    for name, module in model.named_modules():
        if to_key(name) == pattern:
            return module
    return None
