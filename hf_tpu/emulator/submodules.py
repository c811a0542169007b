"""``torch.tpu.compiler``, ``torch.tpu.distributed`` and ``torch.tpu.profiler`` for the emulator.

Each keeps TorchTPU's names; where TorchTPU configures XLA or libtpu the emulator has
nothing to configure, and says so in the docstring rather than pretending.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def build_compiler() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.compiler", "XLA compiler options (recorded; the emulator does not run XLA).")

    @contextlib.contextmanager
    def custom_compiler_options(options: dict[str, str]) -> Iterator[None]:
        """Scope XLA options for ops materialised inside; forbidden inside torch.compile, as on TorchTPU."""
        if not isinstance(options, dict):
            raise TypeError(f"custom_compiler_options expects a dict of str to str, got {type(options).__name__}.")
        if torch.compiler.is_compiling():
            raise RuntimeError("torch.tpu.compiler.custom_compiler_options cannot be used inside torch.compile.")
        yield

    mod.custom_compiler_options = custom_compiler_options
    mod.__all__ = ["custom_compiler_options"]
    return mod


def build_distributed() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.distributed", "Mesh helpers with TorchTPU's names.")

    def topology_aware_mesh(
        mesh_shape: Sequence[int],
        *,
        dcn_mesh_shape: Sequence[int] | None = None,
        allow_split_physical_axes: bool = False,
        contiguous_submeshes: bool = False,
    ) -> torch.Tensor:
        """Device ids laid out as ``mesh_shape``; emulated chips have no physical topology to follow."""
        shape = tuple(int(s) for s in mesh_shape)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        size = 1
        for s in shape:
            size *= s
        if size != world:
            raise ValueError(f"mesh_shape {shape} has {size} devices but the world has {world} processes.")
        return torch.arange(world, dtype=torch.int64).reshape(shape)

    def spmd_safe(fn: Any) -> Any:
        """Pass-through: the emulator has no SPMD-unsafe regions."""
        return fn

    from .distributed import set_tpu_launch_env

    mod.topology_aware_mesh = topology_aware_mesh
    mod.spmd_safe = spmd_safe
    mod.set_tpu_launch_env = set_tpu_launch_env
    mod.__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"]
    return mod


def build_profiler() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.profiler", "Profiler configuration (accepted and recorded).")

    class TpuProfilerConfig:
        """Accepts TorchTPU's options; the emulator profiles with torch.profiler's CPU activity."""

        def __init__(self, **kwargs: Any) -> None:
            self.options = dict(kwargs)

        def __repr__(self) -> str:
            return f"TpuProfilerConfig({self.options})"

    mod.TpuProfilerConfig = TpuProfilerConfig
    mod.__all__ = ["TpuProfilerConfig"]
    return mod
