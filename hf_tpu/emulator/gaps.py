"""TorchTPU's known gaps, reproduced by the emulator (the catalogue with evidence is ``hf_tpu.gaps``).

Most reproductions live in the C++ core (``csrc/gaps.cpp``, ``numerics.cpp``, the allocator's chip
locks, the SDPA backend choice); this module switches them on for the profile and adds the ones that
are Python-level on TorchTPU too: ``avg_pool1d`` without a gradient, ``Tensor.to(<int>)`` landing on
chip 0, and the inductor refusal (in ``compile``). ``visible_devices`` is the device count the core
reports (``host``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from . import _build
from .host_model import Host

# The C++ core's gaps are named by the core itself (``gap_names()``, gaps.cpp's table); these are the
# Python-level ones (names as in hf_tpu.gaps).
PYTHON_GAPS = ("avg_pool1d_gradient", "device_index", "visible_devices")
# Present on every profile: Inductor cannot compile for the device (TorchTPU refuses it by design),
# safetensors' own device parsing is not the backend's, torch's autograd engine is torch's, and the
# autocast dtype list is the device module's answer (TorchTPU's).
INHERENT_GAPS = ("compile_inductor", "safetensors_device", "autograd_exit_abort", "autocast_integer_dtype")
# Of those, the ones that are not TorchTPU's own (safetensors', torch's), left out of the announced count.
NOT_TORCH_TPU = ("safetensors_device", "autograd_exit_abort")

_reproduced: frozenset[str] = frozenset()
_library: Any = None


def reproduced() -> frozenset[str]:
    """The gaps this process's emulated TPU has (on the ideal profile only the inherent ones)."""
    return _reproduced


def abort_mode() -> bool:
    value = os.environ.get("HF_TPU_EMULATOR_GAPS", "raise").strip().lower() or "raise"
    if value not in ("raise", "abort"):
        raise ValueError(
            f"HF_TPU_EMULATOR_GAPS={value!r}: use 'raise' (the default: where TorchTPU aborts the process, the "
            "emulator raises a RuntimeError saying so) or 'abort' (abort like the chip, for harness tests)."
        )
    return value == "abort"


def install(host: Host) -> None:
    """Switch on the profile's gaps (all of them for ``torch_tpu``)."""
    global _reproduced
    core = _build.load()
    faithful = host.profile == "torch_tpu"
    core.set_abort_on_gap(abort_mode())
    core_gaps = core.gap_names()
    core.set_gaps(core_gaps if faithful else [])
    names = set(INHERENT_GAPS)
    if faithful:
        names |= set(core_gaps) | set(PYTHON_GAPS)
        _register_avg_pool1d_without_grad()
        if host.usable > 1:
            _tensor_to_int_lands_on_chip_0()
        else:
            names.discard("device_index")  # needs more than one chip to show
        if host.reported == host.usable:
            names.discard("visible_devices")
    else:
        _register_record_stream_noop()
    _reproduced = frozenset(names)


def _register_avg_pool1d_without_grad() -> None:
    """avg_pool1d's output on TorchTPU is not part of the autograd graph (no grad_fn)."""
    global _library
    _library = _library or torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kept alive for the process)

    def avg_pool1d(keyset: Any, *args: Any) -> torch.Tensor:
        below = keyset & torch._C._after_autograd_keyset
        with torch.no_grad():
            return torch.ops.aten.avg_pool1d.default.redispatch(below, *args)

    _library.impl("avg_pool1d", avg_pool1d, "AutogradPrivateUse1", with_keyset=True)


def _register_record_stream_noop() -> None:
    """The ideal profile: ``Tensor.record_stream`` is a no-op (streams do not reorder work here)."""
    global _library
    _library = _library or torch.library.Library("aten", "IMPL")  # noqa: TOR901

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        return None

    _library.impl("record_stream", record_stream, "PrivateUse1")


def _tensor_to_int_lands_on_chip_0() -> None:
    """``Tensor.to(<int>)`` and ``Module.to(<int>)`` ignore the index on TorchTPU and land on chip 0
    (the transformers TPU CI's ``device_index`` probe); a ``"tpu:N"`` string or device object works."""
    if getattr(torch.Tensor.to, "_hf_tpu_device_index_gap", False):
        return

    def chip_0(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            args = (torch.device("tpu", 0), *args[1:])
        if isinstance(kwargs.get("device"), int) and not isinstance(kwargs["device"], bool):
            kwargs = {**kwargs, "device": torch.device("tpu", 0)}
        return args, kwargs

    for cls in (torch.Tensor, torch.nn.Module):
        original = cls.to

        def to(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            args, kwargs = chip_0(args, kwargs)
            return __original(self, *args, **kwargs)

        functools.update_wrapper(to, original)
        to._hf_tpu_device_index_gap = True  # type: ignore[attr-defined]
        cls.to = to
