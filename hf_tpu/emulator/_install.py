"""Register the emulated device with torch, in TorchTPU's order (reference §1.6)."""

from __future__ import annotations

import atexit
import sys

import torch

from . import _build, compile, distributed, gaps, numerics
from .device_module import build_module
from .generations import Generation
from .host_model import Host


def install(generation: Generation, capacity: int, host: Host) -> None:
    core = _build.load()
    core.register_kernels()
    # Memory that Python owns, dropped by threads without the GIL, is freed here at the latest.
    atexit.register(core.release_deferred_storages)
    core.set_capacity(capacity)
    core.set_device_counts(host.usable, host.reported)
    core.set_device_locks(host.lock_paths(), host.labels())
    torch.utils.rename_privateuse1_backend("tpu")
    module = build_module(generation, capacity, host)
    sys.modules["torch.tpu"] = module
    torch._register_device_module("tpu", module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False
    )
    torch.set_autocast_dtype("tpu", torch.bfloat16)  # TorchTPU's autocast default
    numerics.install(enabled=host.profile == "torch_tpu")
    gaps.install(host)
    compile.install()
    distributed.register()
