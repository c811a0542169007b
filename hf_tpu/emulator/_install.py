"""Register the emulated device with torch, in TorchTPU's order (its ``torch_tpu/_loader.py``)."""

from __future__ import annotations

import atexit
import os
import sys

import torch

from hf_tpu.emulator import _build, compile, distributed, executables, flex_attention, gaps, numerics
from hf_tpu.emulator.device_module import build_module
from hf_tpu.emulator.generations import Generation
from hf_tpu.emulator.host_model import Host


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
    # torch's autocast dtype for the device is left at its default (float16), as TorchTPU leaves it (gap
    # autocast_default_float16); the ideal profile sets bfloat16 (emulator/gaps.py)
    numerics.install(enabled=host.profile == "torch_tpu")
    gaps.install(host)
    compile.install()
    executables.install()
    flex_attention.install()  # as TorchTPU's import: flex_attention on tpu tensors runs as masked SDPA
    distributed.register()
    _rebind_forked_children(core, module, generation, host.profile)


def _rebind_forked_children(core, module, generation: Generation, profile: str) -> None:  # noqa: ANN001
    """A process forked before it used its chip (``notebook_launcher``, multiprocessing with fork) reads its
    binding (``LOCAL_RANK``, visible chips) from the environment at its first device use, as TorchTPU's runtime
    initialises lazily in the child; one forked after it used the chip keeps the parent's."""
    from hf_tpu.emulator import host_model

    def rebind() -> None:
        child = host_model.from_env(generation, profile)
        core.set_device_counts(child.usable, child.reported)
        core.set_device_locks(child.lock_paths(), child.labels())
        module._rebind(child)

    def after_fork_in_child() -> None:
        if not core.any_device_opened():
            core.mark_forked()

    core.set_rebind_hook(rebind)
    os.register_at_fork(after_in_child=after_fork_in_child)
