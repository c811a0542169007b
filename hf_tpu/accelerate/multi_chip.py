"""accelerate (and so Trainer) across TPU chips: one process per chip over the "tpu_dist" process group (accelerate_runs_one_process_per_host).

accelerate derives the distributed type from the accelerator's name (``MULTI_<DEVICE>``) and the process-group
backend from a table; neither knows "tpu", so under ``hf-tpu launch``, ``accelerate launch`` or
``notebook_launcher`` every rank ran alone (``DistributedType.NO``, ``num_processes=1``) on all of the data.
These patches add the missing table rows, the ``MULTI_TPU`` type, and handle it in the few places where
accelerate lists its device types inline. What upstream should do: the same rows and a ``MULTI_TPU`` member.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hf_tpu.fixes import Fix

MULTI_TPU = "MULTI_TPU"


def add_enum_member(enum: Any, value: str) -> Any:
    """``enum(value)`` as a member of one of accelerate's str enums (which list only the devices and backends
    accelerate knows), e.g. ``DynamoBackend("TPU")`` and ``DistributedType("MULTI_TPU")``."""
    if value not in enum._value2member_map_:
        member = str.__new__(enum, value)
        member._name_, member._value_ = value, value
        member.__objclass__ = enum
        setattr(enum, value, member)  # DistributedType.MULTI_TPU, as for the members accelerate declares
        enum._value2member_map_[value] = member
        enum._member_map_[value] = member
    return enum._value2member_map_[value]


def distributed_type_multi_tpu(module: ModuleType) -> None:
    """accelerate.utils.dataclasses: DistributedType.MULTI_TPU exists (what accelerate derives for "tpu")."""
    add_enum_member(module.DistributedType, MULTI_TPU)


def tpu_dist_backend(module: ModuleType) -> None:
    """accelerate.utils.constants: a launched rank on "tpu" joins the "tpu_dist" process group; MULTI_TPU runs
    accelerate's collectives (gather, broadcast, reduce, RNG synchronisation) over torch.distributed."""
    module.TORCH_DISTRIBUTED_BACKENDS.setdefault("tpu", "tpu_dist")
    # CUDA_DISTRIBUTED_TYPES only decides, in accelerate.utils.random, that RNG states are broadcast on the device.
    for types in (module.TORCH_DISTRIBUTED_OPERATION_TYPES, module.CUDA_DISTRIBUTED_TYPES):
        if MULTI_TPU not in types:
            types.append(MULTI_TPU)


def _set_device(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_device(self: Any) -> None:
        if self.device is None and self.distributed_type == MULTI_TPU:
            # A launched rank is bound to its chip; torch.tpu.device_count/set_device are internal to TorchTPU.
            self.device = torch.device("tpu", torch.accelerator.current_device_index())
            return
        original(self)

    set_device.__wrapped__ = original  # type: ignore[attr-defined]
    return set_device


def _wait_for_everyone(original: Callable[..., Any]) -> Callable[..., Any]:
    def wait_for_everyone(self: Any) -> None:
        if self.distributed_type == MULTI_TPU:
            torch.distributed.barrier()  # without device_ids: those name CUDA devices
            return
        original(self)

    wait_for_everyone.__wrapped__ = original  # type: ignore[attr-defined]
    return wait_for_everyone


def partial_state_on_chips(module: ModuleType) -> None:
    """accelerate.state: PartialState puts a MULTI_TPU rank on its own chip and waits for the others with a plain
    barrier (accelerate refused the device type "tpu")."""
    state = module.PartialState
    state.set_device = _set_device(state.set_device)
    state.wait_for_everyone = _wait_for_everyone(state.wait_for_everyone)


def _prepare_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def prepare_model(self: Any, model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.distributed_type != MULTI_TPU or self.verify_device_map(model):
            return original(self, model, *args, **kwargs)
        from accelerate.utils import patch_environment

        # DDP's device_ids name CUDA devices: accelerate passes [local rank], and DDP would move every input to
        # tpu:<local rank>, a chip this process does not own. The model and batches already sit on the chip.
        with patch_environment(ACCELERATE_BYPASS_DEVICE_MAP="true"):
            return original(self, model, *args, **kwargs)

    prepare_model.__wrapped__ = original  # type: ignore[attr-defined]
    return prepare_model


def accelerator_on_chips(module: ModuleType) -> None:
    """accelerate.accelerator: a MULTI_TPU run is multi-device (models wrapped in DDP, even batches, on-device
    checkpoint loading), with DDP left to the chip the process owns."""
    accelerator = module.Accelerator
    multi_device = accelerator.multi_device

    def multi_device_or_chips(self: Any) -> bool:
        return multi_device.fget(self) or (self.use_distributed and self.distributed_type == MULTI_TPU)

    accelerator.multi_device = property(multi_device_or_chips, doc=multi_device.__doc__)
    accelerator.prepare_model = _prepare_model(accelerator.prepare_model)


PATCHES: tuple[Fix, ...] = (
    Fix.patch("accelerate_runs_one_process_per_host", "accelerate.utils.dataclasses", distributed_type_multi_tpu),
    Fix.patch("accelerate_runs_one_process_per_host", "accelerate.utils.constants", tpu_dist_backend),
    Fix.patch("accelerate_runs_one_process_per_host", "accelerate.state", partial_state_on_chips),
    Fix.patch("accelerate_runs_one_process_per_host", "accelerate.accelerator", accelerator_on_chips),
)
