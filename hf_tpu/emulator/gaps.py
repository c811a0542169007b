"""TorchTPU's known gaps, reproduced by the emulator (the records with their evidence are ``hf_tpu.gaps``).

Each gap's record says where it is reproduced (``Gap.emulation``): in the C++ core (``csrc/tpu/gaps.cpp``, and
``numerics.cpp``, the allocator's chip locks, the SDPA backend choice), here in Python (``avg_pool1d`` without a
gradient, ``Tensor.to(<int>)`` landing on chip 0, ``multinomial`` drawing from invalid weights; in ``compile`` the
inductor refusal and compiled graphs refusing CPU tensor inputs; ``visible_devices`` is the device count the core
reports), or on every profile. This module switches them on for the profile, with the operators the real wheel
refuses (``op_coverage``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hf_tpu import settings
from hf_tpu.emulator import _build, op_coverage
from hf_tpu.emulator.host_model import Host


def _named(emulation: str) -> tuple[str, ...]:
    """The gaps whose record says the emulator reproduces them so (``Gap.emulation``)."""
    from hf_tpu.gaps import GAPS

    return tuple(gap.name for gap in GAPS if gap.emulation == emulation)


def not_torch_tpu() -> tuple[str, ...]:
    """Gaps that are not TorchTPU's own (safetensors', torch's), left out of the announced count."""
    from hf_tpu.gaps import GAPS

    return tuple(gap.name for gap in GAPS if gap.component != "torch_tpu")


_reproduced: frozenset[str] = frozenset()
_refused: list[str] = []
_library: Any = None


def reproduced() -> frozenset[str]:
    """The gaps this process's emulated TPU has (on the ideal profile only the inherent ones)."""
    return _reproduced


def refused() -> list[str]:
    """The operators this process's emulated TPU refuses as TorchTPU :data:`RELEASE` does."""
    return list(_refused)


# The TorchTPU release the torch_tpu profile behaves like: it reproduces the gaps this release has (the table's
# fixed_in, from runs of the real wheel) and no longer the ones it fixed.
RELEASE = "0.2.0"


def fixed_in_release() -> frozenset[str]:
    """Gaps of the table that TorchTPU had before, and fixed by :data:`RELEASE`."""
    from packaging.version import Version

    from hf_tpu.gaps import GAPS

    return frozenset(g.name for g in GAPS if g.fixed_in is not None and Version(g.fixed_in) <= Version(RELEASE))


def abort_mode() -> bool:
    return settings.get("HF_TPU_EMULATOR_GAPS") == "abort"


def install(host: Host) -> None:
    """Switch on the profile's gaps (all of them for ``torch_tpu``)."""
    global _reproduced
    core = _build.load()
    faithful = host.profile == "torch_tpu"
    core.set_abort_on_gap(abort_mode())
    fixed = fixed_in_release()
    in_core = _named("core")
    if sorted(core.gap_names()) != sorted(in_core):
        raise RuntimeError(f"the core reproduces {sorted(core.gap_names())}, the gap records say {sorted(in_core)}")
    core_gaps = [name for name in in_core if name not in fixed]
    core.set_gaps(core_gaps if faithful else [])
    global _refused
    _refused = op_coverage.refused_operators(RELEASE) if faithful else []
    core.set_refused_ops(_refused)
    names = set(_named("every profile"))
    if faithful:
        names |= set(core_gaps) | set(_named("python")) - fixed
        _register_avg_pool1d_without_grad()
        _multinomial_draws_from_any_weights()
        if host.usable > 1:
            _tensor_to_int_lands_on_chip_0()
        else:
            names.discard("device_index")  # needs more than one chip to show
        if host.reported == host.usable:
            names.discard("visible_devices")
    else:
        _register_record_stream_noop()
        torch.set_autocast_dtype("tpu", torch.bfloat16)  # no TorchTPU gaps: the dtype its device module names
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


def _multinomial_draws_from_any_weights() -> None:
    """TorchTPU 0.2.0's multinomial checks the sample count (in its words) but not the weights: negative and nan
    weights count as 0, an infinite weight is always drawn, an all-zero row draws index 0 (the real wheel's answers)."""
    if getattr(torch.multinomial, "_hf_tpu_unchecked", False):
        return
    original_fn, original_method = torch.multinomial, torch.Tensor.multinomial

    def prepared(weights: torch.Tensor, num_samples: int, replacement: bool) -> torch.Tensor | None:
        size = weights.size(-1)
        if not replacement and num_samples > size:
            raise RuntimeError(
                f"multinomial(): expected the number of samples to be <= {size} (population size) when replacement "
                f"is disabled, got {num_samples}"
            )
        with torch.no_grad():
            finite = torch.where(weights.isnan() | (weights < 0), 0.0, weights)
            infinite = finite.isinf()
            finite = torch.where(infinite.any(-1, keepdim=True), infinite.to(finite.dtype), finite)
            empty = finite.sum(-1, keepdim=True) == 0
            first = torch.zeros_like(finite)
            first[..., 0] = 1.0
            return torch.where(empty, first, finite)

    @functools.wraps(original_fn)
    def multinomial(input: torch.Tensor, num_samples: int, replacement: bool = False, **kwargs: Any) -> torch.Tensor:
        if isinstance(input, torch.Tensor) and input.device.type == "tpu":
            input = prepared(input, num_samples, replacement)
        return original_fn(input, num_samples, replacement, **kwargs)

    @functools.wraps(original_method)
    def method(self: torch.Tensor, num_samples: int, replacement: bool = False, **kwargs: Any) -> torch.Tensor:
        if self.device.type == "tpu":
            self = prepared(self, num_samples, replacement)
        return original_method(self, num_samples, replacement, **kwargs)

    multinomial._hf_tpu_unchecked = True  # type: ignore[attr-defined]
    torch.multinomial = multinomial
    torch.Tensor.multinomial = method


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
