"""Tensor parallelism in transformers on TPU: one patch per upstream gap.

Installed on TPU processes only (real or emulated), and each patch also checks that the accelerator is
"tpu", so a CPU/CUDA model in the same process sees upstream behaviour.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

from hf_tpu import settings
from hf_tpu.fixes import Fix
from hf_tpu.plumbing.backend import on_tpu
from hf_tpu.tp_plans._core import PlanError, divide_heads, plan_for, validate_plan

LAUNCH_HINT = "hf-tpu launch -n N script.py"


# ---- tp_plan_without_a_launch: tp_plan="auto" without a launch ------------------------------------------------------------
def tp_size_from_launch(module: ModuleType) -> None:
    """transformers.distributed.configuration_utils: remember whether ``tp_size`` came from ``WORLD_SIZE``
    (the config resolves it in ``__post_init__``, before anyone can tell a launch from a plain ``python``)."""
    cls = module.DistributedConfig
    original = cls.__post_init__

    @functools.wraps(original)
    def __post_init__(self) -> None:  # noqa: N807
        self._hf_tpu_tp_from_env = self.tp_size is None and self.tp_plan is not None
        original(self)

    cls.__post_init__ = __post_init__


def _launch_error(config: Any) -> RuntimeError | None:
    """The tp_plan_without_a_launch error when this process is not one rank of a launch, else None."""
    if settings.text("WORLD_SIZE") is not None or torch.distributed.is_initialized():
        return None
    if getattr(config, "_hf_tpu_tp_from_env", False) and config.tp_size == 1:
        what = f"tp_plan={config.tp_plan!r} without tp_size"
    elif config.tp_size > 1:
        what = f"tp_size={config.tp_size}"
    else:
        return None
    return RuntimeError(
        f"hf-tpu: {what} needs one process per TPU chip, but this process was not started by a launcher "
        f"(no WORLD_SIZE), so transformers would use tp_size=1 and shard nothing. Run `{LAUNCH_HINT}` (or "
        "torchrun --nproc-per-node N), or drop tp_plan / pass tp_size=1 to run on one chip on purpose."
    )


def _local_chip_only(device_map: Any) -> bool:
    """Whether a ``device_map`` names only this process's chip (what TP places every shard on anyway)."""
    values = device_map.values() if isinstance(device_map, dict) else [device_map]
    for value in values:
        if isinstance(value, int):
            if value != torch.accelerator.current_device_index():
                return False
            continue
        try:
            device = torch.device(value)
        except (RuntimeError, TypeError):
            return False
        if device.type != "tpu" or device.index not in (None, torch.accelerator.current_device_index()):
            return False
    return True


def tp_needs_launch_and_device_map(module: ModuleType) -> None:
    """transformers.distributed.mixin: a TP request outside a launch says so (tp_plan_without_a_launch); ``device_map="tpu"`` with
    a TP plan works (it names the chip every shard goes to), any other ``device_map`` says what to do; a TP
    plan over one chip (``-n 1``, or ``tp_size=1``) loads onto the chip, not the host."""
    cls = module.DistributedMixin
    original = cls.__dict__["prepare_distribute_model"].__func__

    def prepare_distribute_model(klass, distributed_config, device_map=None):
        if distributed_config is not None and on_tpu():
            config = distributed_config
            if isinstance(config, dict):
                from transformers.distributed import DistributedConfig

                config = distributed_config = DistributedConfig.from_dict(config)
            if (err := _launch_error(config)) is not None:
                raise err
            if config.tp_size > 1 and device_map is not None:
                if not _local_chip_only(device_map):
                    raise ValueError(
                        f"hf-tpu: device_map={device_map!r} cannot be combined with tensor parallelism: each rank "
                        "keeps its shard of every weight on its own chip. Drop device_map (or pass "
                        "device_map='tpu'); to fit a model larger than the chips, raise N in "
                        f"`{LAUNCH_HINT}`, not the offload."
                    )
                device_map = None  # TP places every shard on this rank's chip: the same thing
            elif config.tp_size == 1 and config.tp_plan is not None and device_map is None:
                # a TP plan over one chip is the whole model on the chip (upstream would leave it on the host)
                device_map = torch.device("tpu", torch.accelerator.current_device_index())
        return original(klass, distributed_config, device_map=device_map)

    cls.prepare_distribute_model = classmethod(prepare_distribute_model)


# ---- tp_mesh_not_topology_aware: the topology-aware mesh -------------------------------------------------------------------
def canonical_layout(layout: torch.Tensor) -> torch.Tensor:
    """Keep the topology's groups along the last axis (TP: ``topology_aware_mesh`` orders axes by network
    intensity, so the last one gets the fastest links), with ranks ascending inside each group and groups
    ordered by their first rank.

    torch's DeviceMesh builds each group with ``new_group``, which sorts its ranks, and reuses the world group
    for a mesh over every rank: a mesh whose ranks are not ascending along an axis gets coordinates that
    disagree with the group ranks, and DTensor then stitches shards in the wrong order (found with a reversed
    layout: wrong logits). Membership is what the topology buys; the order inside a group cannot be honoured.
    """
    shape = tuple(layout.shape)
    groups = layout.reshape(-1, shape[-1]).sort(dim=1).values
    groups = groups[groups[:, 0].argsort()]
    return groups.reshape(shape)


def topology_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A DeviceMesh over every rank laid out by ``torch.tpu.distributed.topology_aware_mesh``."""
    from torch.distributed.device_mesh import DeviceMesh

    layout = torch.tpu.distributed.topology_aware_mesh(shape)
    return DeviceMesh("tpu", canonical_layout(torch.as_tensor(layout).reshape(shape)), mesh_dim_names=names)


def tp_topology_aware_mesh(module: ModuleType) -> None:
    """transformers.distributed.utils: lay the (pp, dp, fsdp, tp) mesh out with
    ``torch.tpu.distributed.topology_aware_mesh`` so the TP axis follows the chips' ICI links, instead of
    ``init_device_mesh``'s rank order."""
    original = module.initialize_distributed_mesh

    @functools.wraps(original)
    def initialize_distributed_mesh(distributed_config):
        if not on_tpu():
            return original(distributed_config)
        c = distributed_config
        shape = (c.pp_size, c.dp_replicate_size, c.fsdp_size, c.tp_size)
        if shape == (1, 1, 1, 1):
            return None, None
        module._ensure_torch_distributed("tpu")
        world = torch.distributed.get_world_size()
        if world != (expected := shape[0] * shape[1] * shape[2] * shape[3]):
            raise RuntimeError(f"The parallel mesh requires {expected} processes, but world_size is {world}.")
        device_map = module._bind_local_device("tpu", int(settings.text("LOCAL_RANK") or 0))
        dense = topology_mesh(shape, ("pp", "dp_replicate", "fsdp", "tp"))
        expert_shape = (c.pp_size, c.dp_replicate_size, c.efsdp_size, c.ep_size)
        expert = topology_mesh(expert_shape, ("pp", "dp_replicate", "efsdp", "ep"))
        return device_map, module.TransformersDeviceMesh(dense, expert)

    module.initialize_distributed_mesh = initialize_distributed_mesh


def tp_mesh_in_mixin(module: ModuleType) -> None:
    """transformers.distributed.mixin imported the function by name: point it at the patched one."""
    from transformers.distributed import utils

    module.initialize_distributed_mesh = utils.initialize_distributed_mesh


# ---- models_without_a_tp_plan: plans for models that ship none, checked before any weight is read ------------------------------
def _ships_own_plan(name: str, module: Any) -> bool:
    config = getattr(module, "config", None)
    return bool(getattr(config, "base_model_tp_plan", None)) or bool(type(module).__dict__.get("_tp_plan"))


def tp_plan_registry_and_validation(module: ModuleType) -> None:
    """transformers.distributed.mixin: when a model (or a sub-model) has no TP plan, take hf_tpu's from the
    registry; then validate the resolved plan against the model on meta, so a plan that does not divide fails
    before the checkpoint is opened, naming the module and the number."""
    cls = module.DistributedMixin
    original = cls._resolve_parallel_plans

    @functools.wraps(original)
    def _resolve_parallel_plans(self, distributed_config):
        tp_size = distributed_config.tp_size
        if on_tpu() and tp_size > 1:
            extra = plan_for(self, skip=_ships_own_plan)
            if extra:
                self._tp_plan = {**extra, **(self._tp_plan or {})}
        tp_plan, ep_plan, fsdp_plan = original(self, distributed_config)
        if on_tpu() and tp_size > 1 and tp_plan:
            try:
                validate_plan(self, tp_plan, tp_size)
            except PlanError as err:
                raise PlanError(f"hf-tpu: {err} (checked before loading any weight)") from None
            divide_heads(self, tp_size)
        return tp_plan, ep_plan, fsdp_plan

    cls._resolve_parallel_plans = _resolve_parallel_plans


PATCHES: tuple[Fix, ...] = (
    Fix.patch("tp_plan_without_a_launch", "transformers.distributed.configuration_utils", tp_size_from_launch),
    Fix.patch("tp_plan_without_a_launch", "transformers.distributed.mixin", tp_needs_launch_and_device_map),
    Fix.patch("tp_mesh_not_topology_aware", "transformers.distributed.utils", tp_topology_aware_mesh),
    Fix.patch("tp_mesh_not_topology_aware", "transformers.distributed.mixin", tp_mesh_in_mixin),
    Fix.patch("models_without_a_tp_plan", "transformers.distributed.mixin", tp_plan_registry_and_validation),
)
