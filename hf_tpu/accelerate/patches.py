"""accelerate's gaps on TPU, one small patch each (listed by ``hf-tpu gaps --fixes`` and ``hf-tpu env``)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hf_tpu.accelerate import multi_chip
from hf_tpu.accelerate.multi_chip import add_enum_member
from hf_tpu.fixes import Fix, install_patches
from hf_tpu.plumbing.backend import on_tpu


class TpuGenerators:
    """The device RNG API accelerate's checkpointing calls, over TorchTPU's public ``default_generators``
    (``torch.tpu.get_rng_state`` is internal to TorchTPU: user and library code may not call it)."""

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [g.get_state() for g in torch.tpu.default_generators]

    @staticmethod
    def set_rng_state_all(states: list[torch.Tensor]) -> None:
        for generator, state in zip(torch.tpu.default_generators, states, strict=False):
            generator.set_state(state)


def _tpu_rng_backend(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_torch_accelerator_backend(*args: Any, **kwargs: Any) -> Any:
        device_type, device_module = original(*args, **kwargs)
        if device_type == "tpu" and on_tpu():
            return device_type, TpuGenerators
        return device_type, device_module

    get_torch_accelerator_backend.__wrapped__ = original  # type: ignore[attr-defined]
    return get_torch_accelerator_backend


def checkpoint_rng_through_generators(module: ModuleType) -> None:
    """accelerate.checkpointing: save_state()/load_state() keep the tpu RNG through the public default_generators
    (accelerate called the internal torch.tpu.get_rng_state and failed)."""
    module.get_torch_accelerator_backend = _tpu_rng_backend(module.get_torch_accelerator_backend)


def _plugin_post_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __post_init__(self: Any) -> None:  # noqa: N807
        original(self)
        if self.backend.value == "TPU" and self.dynamic is None:
            self.dynamic = False  # TorchTPU compiles static shapes only (dynamic=True is refused)

    __post_init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __post_init__


def dynamo_backend_tpu(module: ModuleType) -> None:
    """accelerate.utils.dataclasses: dynamo_backend="tpu" / torch_compile_backend="tpu" are accepted (TorchTPU's
    compile backend), with dynamic=False unless asked otherwise."""
    add_enum_member(module.DynamoBackend, "TPU")
    plugin = module.TorchDynamoPlugin
    plugin.__post_init__ = _plugin_post_init(plugin.__post_init__)


def _training_args_post_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __post_init__(self: Any) -> None:  # noqa: N807
        wants_compile = self.torch_compile or self.torch_compile_mode is not None
        if wants_compile and self.torch_compile_backend is None and not self.use_cpu and on_tpu():
            self.torch_compile_backend = "tpu"  # not transformers' default "inductor", which TorchTPU refuses
        original(self)

    __post_init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __post_init__


def torch_compile_on_tpu(module: ModuleType) -> None:
    """transformers.training_args: TrainingArguments(torch_compile=True) on TPU compiles with the "tpu" backend."""
    module.TrainingArguments.__post_init__ = _training_args_post_init(module.TrainingArguments.__post_init__)


PATCHES: tuple[Fix, ...] = (
    Fix.patch("checkpoint_rng_misses_the_tpu", "accelerate.checkpointing", checkpoint_rng_through_generators),
    Fix.patch("compile_backend_tpu_refused", "accelerate.utils.dataclasses", dynamo_backend_tpu),
    Fix.patch("compile_backend_tpu_refused", "transformers.training_args", torch_compile_on_tpu),
    *multi_chip.PATCHES,
)


def install() -> None:
    install_patches(PATCHES)
