"""``torch.tpu.compiler``, ``torch.tpu.distributed`` and ``torch.tpu.profiler`` for the emulator.

Each keeps TorchTPU's names; where TorchTPU configures XLA or libtpu the emulator has
nothing to configure, and says so in the docstring rather than pretending.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.util
import os
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from hf_tpu.emulator.api_stage import warn_experimental


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


class _DistributedModule(types.ModuleType):
    """``torch.tpu.distributed``: a module type so that TorchTPU's two DMA-striping knobs are properties."""

    def __dir__(self) -> list[str]:
        return sorted(set(self.__all__) | set(self.__dict__))

    _num_stripes, _stripe_chunk_mb = 4, 8  # TorchTPU 0.2.0's defaults

    @property
    def window_num_stripes(self) -> int:
        """Concurrent DMA stripes of WindowTpu peer transfers (recorded; emulated chips copy in host memory)."""
        warn_experimental("distributed.window_num_stripes")
        return self._num_stripes

    @window_num_stripes.setter
    def window_num_stripes(self, value: int) -> None:
        warn_experimental("distributed.window_num_stripes")
        self._num_stripes = _positive("window_num_stripes", value)

    @property
    def window_stripe_chunk_mb(self) -> int:
        """Smallest payload (MB) per parallel DMA stripe (recorded)."""
        warn_experimental("distributed.window_stripe_chunk_mb")
        return self._stripe_chunk_mb

    @window_stripe_chunk_mb.setter
    def window_stripe_chunk_mb(self, value: int) -> None:
        warn_experimental("distributed.window_stripe_chunk_mb")
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:  # TorchTPU's words
            raise RuntimeError(f"_set_window_stripe_chunk_mb(): expected window_stripe_chunk_mb to be > 0, got {value}")
        self._stripe_chunk_mb = _positive("window_stripe_chunk_mb", value)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"torch.tpu.distributed.{name} must be a positive int, got {value!r}.")
    return value


def build_distributed() -> types.ModuleType:
    mod = _DistributedModule("torch.tpu.distributed", "Mesh helpers with TorchTPU's names.")
    # `python -m torch.tpu.distributed` runs, as on TorchTPU (runpy reads the code through this spec).
    main = os.path.join(os.path.dirname(__file__), "distributed_main.py")
    loader = importlib.machinery.SourceFileLoader("torch.tpu.distributed", main)
    mod.__spec__ = importlib.util.spec_from_loader("torch.tpu.distributed", loader, origin=main)

    def topology_aware_mesh(
        mesh_shape: Sequence[int],
        *,
        dcn_mesh_shape: Sequence[int] | None = None,
        allow_split_physical_axes: bool = False,
        contiguous_submeshes: bool = False,
    ) -> torch.Tensor:
        """Global ranks laid out as ``mesh_shape`` (int64), for ``DeviceMesh("tpu", mesh=...)``: the emulated
        chips in (slice, host, chip) order, split across slices along ``dcn_mesh_shape`` (inferred: the outermost
        axis longer than 1) as TorchTPU's hybrid mesh. Needs an initialised process group (a collective)."""
        from hf_tpu.emulator.topology import gather_chips, rank_layout

        if not torch.distributed.is_initialized():
            raise RuntimeError(
                "PyTorch distributed process group must be initialized before calling topology_aware_mesh."
            )
        return rank_layout(gather_chips(), mesh_shape, dcn_mesh_shape)

    def spmd_safe(func: Any) -> Any:
        """Mark ``func`` as run identically on every rank. TorchTPU then fuses its collectives with the
        surrounding ops and synchronises its TPU inputs and outputs; the emulator runs ops one by one, so the
        wrapper only keeps TorchTPU's contract: the same signature and result, an annotation under compile."""
        warn_experimental("distributed.spmd_safe")

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not torch.compiler.is_compiling():
                return func(*args, **kwargs)
            with torch.fx.traceback.annotate({"spmd_safe": True}):
                return func(*args, **kwargs)

        return wrapper

    from hf_tpu.emulator.distributed import set_tpu_launch_env

    mod.topology_aware_mesh = topology_aware_mesh
    mod.spmd_safe = spmd_safe
    mod.set_tpu_launch_env = set_tpu_launch_env
    mod.__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh", "window_num_stripes",
                   "window_stripe_chunk_mb"]  # fmt: skip
    return mod


class TpuProfilerConfig(torch.profiler._ExperimentalConfig):
    """TorchTPU's profiler options (validated as TorchTPU does, then recorded); the emulator profiles with
    torch.profiler's CPU activity, so the levels change nothing here."""

    def __init__(
        self,
        *,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        run_dir: os.PathLike[str] | str | None = None,
        worker_rank: str | None = None,
        experimental_options: dict[str, int | bool | str] | None = None,
        check_experimental_options: bool = True,
    ) -> None:
        if worker_rank is not None:
            if not isinstance(worker_rank, str):
                raise TypeError(f"worker_rank must be a string, got {type(worker_rank)}")
            if ":" in worker_rank or "," in worker_rank:
                raise ValueError(f"worker_rank string cannot contain ':' or ',': {worker_rank!r}")
        super().__init__()
        self.options = {
            "host_tracer_level": host_tracer_level,
            "device_tracer_level": device_tracer_level,
            "python_tracer_level": python_tracer_level,
            "run_dir": os.fspath(run_dir) if run_dir is not None else None,
            "worker_rank": worker_rank,
            "experimental_options": dict(experimental_options or {}),
            "check_experimental_options": check_experimental_options,
        }

    def __repr__(self) -> str:
        return f"TpuProfilerConfig({self.options})"


def _warns_first(init: Any) -> Any:
    """The experimental-API warning comes before the arguments are checked, as on TorchTPU."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        warn_experimental("profiler.TpuProfilerConfig")
        init(self, *args, **kwargs)

    return __init__


TpuProfilerConfig.__init__ = _warns_first(TpuProfilerConfig.__init__)  # type: ignore[method-assign]


def build_profiler() -> types.ModuleType:
    mod = types.ModuleType("torch.tpu.profiler", "Profiler configuration (accepted and recorded).")
    mod.TpuProfilerConfig = TpuProfilerConfig
    mod.__all__ = ["TpuProfilerConfig"]
    return mod
