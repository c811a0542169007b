"""Tensor parallelism in diffusers on TPU: SD3's plan (models_without_a_tp_plan), optional plan rules, per-rank head counts,
the device index (tp_device_index_differs) and the topology-aware mesh (tp_mesh_not_topology_aware).

Installed on TPU processes only, and each runtime patch checks the mesh or accelerator is "tpu".
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.plumbing.backend import on_tpu
from hf_tpu.tp_plans._core import IfPresent, divide_heads, get


class RegistryPlan(dict):
    """A ``_tp_plan`` that came from hf_tpu's registry (so hf_tpu's own semantics, e.g. :class:`IfPresent`,
    apply to it and nothing else)."""


# ---- models_without_a_tp_plan: SD3 ships no _tp_plan -----------------------------------------------------------------------
def sd3_tp_plan(module: ModuleType) -> None:
    """diffusers.models.transformers.transformer_sd3: give ``SD3Transformer2DModel`` hf_tpu's plan when it has
    none, so ``parallel_config=TensorParallelConfig(tp_degree=N)`` and ``enable_parallelism`` work."""
    cls = module.SD3Transformer2DModel
    entry = get(cls)
    if entry is not None and cls.__dict__.get("_tp_plan") is None and on_tpu():
        cls._tp_plan = RegistryPlan(entry.plan)


def _present(block: torch.nn.Module, path: str) -> bool:
    node: Any = block
    for atom in path.split("."):
        node = getattr(node, atom, None)
        if node is None:
            return False
    return True


def tp_plan_if_present_rules(module: ModuleType) -> None:
    """diffusers.hooks.tensor_parallel: a registry rule marked :class:`IfPresent` applies to the blocks that
    have the module (SD3's last block has no ``to_add_out``/``ff_context``); upstream would fail on them."""
    original = module._resolve_tp_plan

    @functools.wraps(original)
    def _resolve_tp_plan(model, tp_plan):
        groups = original(model, {k: v for k, v in tp_plan.items() if not isinstance(v, IfPresent)})
        optional = {k: v for k, v in tp_plan.items() if isinstance(v, IfPresent)}
        if not optional:
            return groups
        by_block = {id(block): (block, plan) for block, plan in groups}
        order = [id(block) for block, _ in groups]
        for pattern, style in optional.items():
            prefix, star, suffix = pattern.partition("*")
            if star:
                container = model.get_submodule(prefix.strip("."))
                relative, blocks = suffix.strip("."), list(container)
            else:
                relative, blocks = pattern, [model]
            for block in blocks:
                if not _present(block, relative):
                    continue
                if id(block) not in by_block:
                    by_block[id(block)] = (block, {})
                    order.append(id(block))
                by_block[id(block)][1][relative] = style
        return [by_block[key] for key in order]

    module._resolve_tp_plan = _resolve_tp_plan


def tp_heads_per_rank(module: ModuleType) -> None:
    """diffusers.hooks.tensor_parallel: after sharding a registry-planned model, its attention modules count
    the heads this rank holds (SD3's processor derives head_dim from ``attn.heads``)."""
    original = module.apply_tensor_parallel

    @functools.wraps(original)
    def apply_tensor_parallel(model, config, tp_plan, weights_already_sharded=False):
        result = original(model, config, tp_plan, weights_already_sharded=weights_already_sharded)
        if isinstance(tp_plan, RegistryPlan) and config._mesh.device_type == "tpu":
            divide_heads(model, config._mesh.size())
        return result

    module.apply_tensor_parallel = apply_tensor_parallel


# ---- tp_device_index_differs + tp_mesh_not_topology_aware: one chip per process, topology-aware mesh ---------------------------------------------------
def tp_device_is_the_bound_chip(module: ModuleType) -> None:
    """diffusers.models.modeling_utils: the TP device is ``tpu:<current_device_index()>`` as in transformers
    (TorchTPU gives each process one chip), not ``rank % device_count()``; and a TP config without a mesh
    gets ``torch.tpu.distributed.topology_aware_mesh`` (tp_mesh_not_topology_aware) when it spans the world."""
    cls = module.ModelMixin
    original = cls._resolve_parallel_config

    @functools.wraps(original)
    def _resolve_parallel_config(self, config):
        if not on_tpu():
            return original(self, config)
        from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig

        tp = config if isinstance(config, TensorParallelConfig) else None
        if isinstance(config, ParallelConfig):
            tp = config.tensor_parallel_config
        if (
            tp is not None
            and tp.mesh is None
            and torch.distributed.is_initialized()
            and tp.tp_degree == torch.distributed.get_world_size()
        ):
            from hf_tpu.tp_plans.transformers import topology_mesh

            tp.mesh = topology_mesh((tp.tp_degree,), ("tp",))
        resolved = original(self, config)
        device = torch.device("tpu", torch.accelerator.current_device_index())
        if resolved._device != device:
            resolved.setup(resolved._rank, resolved._world_size, device, mesh=resolved._mesh)
        return resolved

    cls._resolve_parallel_config = _resolve_parallel_config


PATCHES: tuple[Fix, ...] = (
    Fix.patch("models_without_a_tp_plan", "diffusers.models.transformers.transformer_sd3", sd3_tp_plan),
    Fix.patch("models_without_a_tp_plan", "diffusers.hooks.tensor_parallel", tp_plan_if_present_rules),
    Fix.patch("models_without_a_tp_plan", "diffusers.hooks.tensor_parallel", tp_heads_per_rank),
    Fix.patch("tp_device_index_differs", "diffusers.models.modeling_utils", tp_device_is_the_bound_chip),
)
