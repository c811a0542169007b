"""``torch.tpu`` for the emulated TPU, with TorchTPU 0.2.0's public names and signatures.

Exactly TorchTPU's 30 public names are exported; names it deliberately lacks
(``empty_cache``, ``mem_get_info``, ``memory_allocated``, ``is_bf16_supported``...) stay
absent because Hugging Face libraries branch on ``hasattr``. Memory statistics are read
through ``torch.accelerator``, as on TorchTPU.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hf_tpu import settings
from hf_tpu.emulator import _build, compile, numerics
from hf_tpu.emulator.api_stage import check_internal, experimental, internal, warn_experimental
from hf_tpu.emulator.generations import Generation, format_bytes
from hf_tpu.emulator.host_model import Host

PUBLIC_NAMES = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "set_stream",
    "current_stream",
    "device",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "manual_seed",
    "manual_seed_all",
    "default_generators",
    "is_initialized",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "Stream",
    "Event",
    "stream",
    "default_stream",
    "device_of",
    "EagerMode",
    "eager_mode",
    "set_eager_mode",
    "Precision",
    "precision",
    "allow_excess_precision",
    "topology_aware_mesh",
)
SUBMODULES = ("compiler", "distributed", "ops", "optimizers", "pallas", "profiler")

_AMP_DTYPES = [
    torch.bfloat16,
    torch.bool,
    torch.complex128,
    torch.complex64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.uint8,
]


class EagerMode(enum.Enum):
    """TorchTPU's eager execution modes (the emulator always runs ops one by one, synchronously)."""

    DEFER_AND_FUSE = "DEFER_AND_FUSE"
    DEFER_NEVER = "DEFER_NEVER"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "DEFER_NEVER_AND_LAUNCH_BLOCKING"
    _INTERNAL_COMPILE_FX_GRAPH = "INTERNAL_COMPILE_FX_GRAPH"  # TorchTPU's export path; accepted, runs eagerly


class Precision(enum.Enum):
    """StableHLO ``dot_general`` precision: DEFAULT (1 bf16 pass), HIGH (3 passes), HIGHEST (float32)."""

    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2


@dataclass(frozen=True)
class _TpuDeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int = 1


def _check_tpu_device(device: Any, what: str) -> None:
    dev = torch.device(device) if not isinstance(device, int) else torch.device("tpu", device)
    if dev.type != "tpu" or (dev.index is not None and dev.index != 0):
        raise ValueError(f"{what}: device must be this process's TPU ('tpu' or 'tpu:0'), got {device!r}.")


class TpuStream(torch.Stream):
    """A stream on the emulated chip. XLA orders work by data dependencies; streams exist so FSDP works."""

    def __new__(cls, device: Any = None, priority: int = 0, stream_id: int | None = None, **kwargs: Any):
        if stream_id is None:
            return super().__new__(cls, device=device if device is not None else "tpu", priority=priority)
        base = torch.accelerator.current_stream()
        return super().__new__(cls, stream_id=stream_id, device_index=0, device_type=base.device_type)

    def query(self) -> bool:
        raise NotImplementedError("TpuStream.query is not implemented (as on TorchTPU).")

    @staticmethod
    def priority_range() -> tuple[int, int]:
        raise NotImplementedError("TpuStream.priority_range is not implemented (as on TorchTPU).")

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def is_dense(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<torch.tpu.TpuStream>"


class TpuEvent(torch.Event):
    """An event on the emulated chip; ``elapsed_time`` is host-measured, as on TorchTPU."""

    def __new__(
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
        device: Any = None,
    ):
        event = super().__new__(
            cls, device=device or "tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )
        event._enable_timing = enable_timing
        return event

    def record(self, stream: Any = None) -> None:
        self._host_time = time.perf_counter()
        super().record(stream)

    def elapsed_time(self, end_event: TpuEvent) -> float:
        """Milliseconds between two recorded events, measured on the host (as TorchTPU does)."""
        for event in (self, end_event):
            if not getattr(event, "_enable_timing", False):
                raise RuntimeError("elapsed_time requires both events to be created with enable_timing=True.")
            if not hasattr(event, "_host_time"):
                raise RuntimeError("Both events must be recorded before calling elapsed_time.")
        return (end_event._host_time - self._host_time) * 1000.0

    def wait(self, stream: Any = None) -> None:
        """A no-op: the emulated device runs every op synchronously."""

    def ipc_handle(self) -> Any:
        raise NotImplementedError("TpuEvent.ipc_handle is not supported on TPU.")

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: Any) -> Any:
        raise NotImplementedError("TpuEvent.from_ipc_handle is not supported on TPU.")


class device_of:  # noqa: N801  (TorchTPU's name: a class, as torch.cuda.device_of)
    """Context manager: the device of ``obj`` (a tensor or storage) while inside; a no-op off the TPU. Each
    process owns one chip, so there is nothing to switch to."""

    def __init__(self, obj: Any) -> None:
        warn_experimental("device_of")
        on_tpu = getattr(obj, "is_tpu", False) or getattr(getattr(obj, "device", None), "type", None) == "tpu"
        self.idx = obj.get_device() if on_tpu else -1

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class device:  # noqa: N801  (TorchTPU's name)
    """Context manager selecting the device; only the process's own chip is valid (internal on TorchTPU)."""

    def __init__(self, device: Any) -> None:
        check_internal("device", "device_index", depth=1)
        self.idx = -1 if device is None else torch.device("tpu", device).index if isinstance(device, int) else 0
        if isinstance(device, (str, torch.device)):
            dev = torch.device(device)
            self.idx = dev.index or 0
        if self.idx not in (-1, 0):
            raise ValueError(f"Cannot set TPU device to index {self.idx}, current process is bound to device index 0.")

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class TpuModule(types.ModuleType):
    """The ``torch.tpu`` module object; a module subclass so that a few names can be properties."""

    def __init__(self, generation: Generation, capacity: int, host: Host) -> None:
        super().__init__("torch.tpu", __doc__)
        self._generation = generation
        self._capacity = capacity
        self._host = host
        self._eager_mode = EagerMode.DEFER_NEVER
        if settings.text("TORCH_TPU_DEFER_AND_FUSE") == "1":
            self._eager_mode = EagerMode.DEFER_AND_FUSE
        if settings.text("TORCH_TPU_LAUNCH_BLOCKING") == "1":
            self._eager_mode = EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        self._allow_excess_precision = False
        self._autocast_enabled = False
        self._autocast_dtype = torch.bfloat16
        self._default_generators: tuple[torch.Generator, ...] | None = None
        self.__all__ = list(PUBLIC_NAMES) + list(SUBMODULES)
        self.EagerMode = EagerMode
        self.Precision = Precision
        self.device = device
        self.device_of = device_of

    def __dir__(self) -> list[str]:
        return list(self.__all__)

    # ---- properties (module-level read/write attributes on TorchTPU) ----
    @property
    def eager_mode(self) -> EagerMode:
        return self._eager_mode

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        if not isinstance(mode, EagerMode):
            raise TypeError(f"torch.tpu.eager_mode must be a torch.tpu.EagerMode, got {mode!r}.")
        self._eager_mode = mode

    @property
    def allow_excess_precision(self) -> bool:
        return self._allow_excess_precision

    @allow_excess_precision.setter
    def allow_excess_precision(self, value: bool) -> None:
        self._allow_excess_precision = bool(value)

    def _rebind(self, host: Host) -> None:
        """A forked child's own view of the host (its chip), read at its first device use."""
        self._host = host
        self._default_generators = None

    @property
    def default_generators(self) -> tuple[torch.Generator, ...]:
        _build.load().device_counts()  # a forked child binds to its chip first
        if self._default_generators is None:
            core = _build.load()
            self._default_generators = tuple(core.default_generator(i) for i in range(self._host.usable))
        return self._default_generators

    # ---- internal on TorchTPU: only torch / torch_tpu may call these ----
    @internal("is_available")
    def is_available(self) -> bool:
        return True

    @internal("device_count")
    def device_count(self) -> int:
        return _build.load().device_counts()[1]  # a forked child binds to its chip first

    @internal("current_device_index")
    def current_device(self) -> int:
        return torch.accelerator.current_device_index()

    @internal("set_device_index")
    def set_device(self, device: int | str | torch.device) -> None:
        if isinstance(device, int):
            index = device
        elif isinstance(device, (str, torch.device)):
            dev = torch.device(device)
            if dev.type != "tpu":
                raise ValueError(f"Expected a tpu device, got {device!r}.")
            index = 0 if dev.index is None else dev.index
        else:
            raise TypeError(f"set_device expects an int, str or torch.device, got {type(device).__name__}.")
        if index != 0:
            raise ValueError(
                f"Cannot set TPU device to index {index}, current process is bound to device index 0 "
                "(one chip per process; launch one process per chip)."
            )

    @internal("synchronize")
    def synchronize(self, device: int | None = None) -> None:
        torch.accelerator.synchronize()

    @internal("set_stream")
    def set_stream(self, stream: torch.Stream) -> None:
        torch.accelerator.set_stream(stream)

    @internal("current_stream")
    def current_stream(self, device: torch.device | None = None) -> TpuStream:
        return TpuStream(stream_id=torch.accelerator.current_stream().stream_id)

    @internal("random.initial_seed")
    def initial_seed(self) -> int:
        return self.default_generators[0].initial_seed()

    @internal("random.get_rng_state")
    def get_rng_state(self, device: Any = "tpu") -> torch.Tensor:
        _check_tpu_device(device, "get_rng_state")
        return self.default_generators[0].get_state()

    # ---- experimental ----
    @experimental
    def set_rng_state(self, new_state: torch.Tensor, device: Any = "tpu") -> None:
        _check_tpu_device(device, "set_rng_state")
        self.default_generators[0].set_state(new_state)

    @experimental
    def manual_seed(self, seed: int) -> None:
        self.default_generators[torch.accelerator.current_device_index()].manual_seed(int(seed))

    @experimental
    def manual_seed_all(self, seed: int) -> None:
        for generator in self.default_generators:
            generator.manual_seed(int(seed))

    @experimental
    def is_initialized(self) -> bool:
        return True

    @experimental
    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return list(_AMP_DTYPES)

    @experimental
    def get_device_name(self, device: Any = None) -> str:
        return f"{self._generation.name} (emulated on CPU)"

    @experimental
    def get_device_properties(self, device: Any = None) -> _TpuDeviceProperties:
        return _TpuDeviceProperties(self.get_device_name(), self._capacity, 1)

    @experimental
    def Stream(self, device: Any = None, priority: int = 0, **kwargs: Any) -> TpuStream:  # noqa: N802
        return TpuStream(device, priority, **kwargs)

    @experimental
    def Event(  # noqa: N802
        self,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
        device: Any = None,
    ) -> TpuEvent:
        return TpuEvent(enable_timing, blocking, interprocess, external, device)

    @experimental
    @contextlib.contextmanager
    def stream(self, stream: TpuStream | None) -> Iterator[None]:
        if stream is None:
            yield
            return
        previous = torch.accelerator.current_stream()
        torch.accelerator.set_stream(stream)
        try:
            yield
        finally:
            torch.accelerator.set_stream(previous)

    @experimental
    def default_stream(self, device: Any = None) -> TpuStream:
        return TpuStream(stream_id=0)

    @experimental
    @contextlib.contextmanager
    def set_eager_mode(self, mode: EagerMode) -> Iterator[None]:
        previous = self._eager_mode
        self.eager_mode = mode
        try:
            yield
        finally:
            self._eager_mode = previous

    @experimental
    @contextlib.contextmanager
    def precision(self, mode: Precision) -> Iterator[None]:
        """Matmul/convolution precision for the ops inside (overrides torch.set_float32_matmul_precision)."""
        if torch.compiler.is_compiling():
            torch._dynamo.graph_break()  # as TorchTPU: precision is not traceable
        if not isinstance(mode, Precision):
            raise ValueError(
                "expected to be one of 'PrecisionConfig.DEFAULT', 'PrecisionConfig.HIGH', or "
                f"'PrecisionConfig.HIGHEST', got '{mode}'"
            )
        with numerics.scoped(mode.value):
            yield

    def topology_aware_mesh(
        self,
        mesh_shape: Any,
        *,
        dcn_mesh_shape: Any = None,
        allow_split_physical_axes: bool = False,
        contiguous_submeshes: bool = False,
    ) -> torch.Tensor:
        import warnings

        warnings.warn(
            "<TorchTpu/ApiStage/DeprecatedApi/> torch.tpu.topology_aware_mesh is deprecated; "
            "use torch.tpu.distributed.topology_aware_mesh.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.distributed.topology_aware_mesh(
            mesh_shape,
            dcn_mesh_shape=dcn_mesh_shape,
            allow_split_physical_axes=allow_split_physical_axes,
            contiguous_submeshes=contiguous_submeshes,
        )

    # ---- private members PyTorch itself calls ----
    def _lazy_init(self) -> None:
        pass

    def _is_in_bad_fork(self) -> bool:
        return False

    def _get_generator(self, device: torch.device) -> torch.Generator:
        index = device.index if device.index is not None else torch.accelerator.current_device_index()
        return self.default_generators[index]

    def _is_autocast_enabled(self) -> bool:
        return self._autocast_enabled

    def _set_autocast_enabled(self, enabled: bool) -> None:
        self._autocast_enabled = bool(enabled)

    def _get_autocast_dtype(self) -> torch.dtype:
        return self._autocast_dtype

    def _set_autocast_dtype(self, dtype: torch.dtype) -> None:
        if dtype not in _AMP_DTYPES:
            raise ValueError(f"Autocast dtype {dtype} is not supported on TPU; use one of {_AMP_DTYPES}.")
        self._autocast_dtype = dtype

    def _get_compute_capability(self) -> str:
        return ""

    def _is_triton_capable(self) -> bool:
        return False

    def _is_gpu(self) -> bool:
        return False

    def _get_multi_processor_count(self) -> int:
        return 1

    def _exchange_device(self, device: int) -> int:
        return 0

    def _maybe_exchange_device(self, device: int) -> int:
        return 0

    def _get_cache_stats(self) -> compile.PerfStats:
        return compile.cache_stats()

    def _get_cache_requests(self) -> int:
        return compile.cache_stats().num_cache_reqs

    def _get_cache_hits(self) -> int:
        return compile.cache_stats().num_cache_hits

    def _get_cache_misses(self) -> int:
        stats = compile.cache_stats()
        return stats.num_cache_reqs - stats.num_cache_hits

    def _clear_cache(self) -> None:
        compile.clear_cache()

    def _hbm_usage_summary(self) -> str:
        free, total = torch.accelerator.get_memory_info()
        used = total - free
        peak = torch.accelerator.max_memory_allocated()
        return (
            f"{self._generation.name} (emulated) tpu:0: {format_bytes(used)} in use, {format_bytes(peak)} peak, "
            f"{format_bytes(free)} free of {format_bytes(total)}"
        )


def build_module(generation: Generation, capacity: int, host: Host) -> TpuModule:
    """Create ``torch.tpu`` and its submodules."""
    from hf_tpu.emulator import pallas, submodules, tpu_ops, tpu_optimizers

    builders = {
        "compiler": submodules.build_compiler,
        "distributed": submodules.build_distributed,
        "ops": tpu_ops.build_module,
        "optimizers": tpu_optimizers.build_module,
        "pallas": pallas.build_module,
        "profiler": submodules.build_profiler,
    }
    module = TpuModule(generation, capacity, host)
    for name in SUBMODULES:
        sub = builders[name]()
        setattr(module, name, sub)
        sys.modules[f"torch.tpu.{name}"] = sub
    return module
