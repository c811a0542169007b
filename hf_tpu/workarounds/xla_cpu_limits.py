"""What XLA's CPU plugin cannot run, worked around so the real wheel on XLA:CPU (``HF_TPU_XLA_CPU=1``) runs what a
chip runs. These are limits of XLA:CPU, not gaps of TorchTPU: they are installed only in that mode, and listed in
``hf-tpu env`` with kind ``xla_cpu_limit``.

- ``scans_as_log_steps``: TorchTPU lowers ``cumsum``, ``cumprod``, ``logcumsumexp``, ``cummax`` and ``cummin`` to an
  HLO scan, which XLA:CPU aborts on (``computation_partitioner.cc:269 Check failed``: the process dies). They run
  as log-step scans instead (``ceil(log2 n)`` shifted adds, products, log-add-exps or comparisons), in eager mode
  (tpu kernels) and in compiled graphs (the graph's calls are rewritten before the backend lowers them). Integer
  results are exact; floating sums and products are added in another order than a sequential scan's.
- ``attention_without_pallas``: TorchTPU's flash attention is a Pallas kernel (a ``tpu_custom_call``), which
  XLA:CPU has no implementation of; with the flash backend off, TorchTPU takes its math path.
- ``memory_info_from_the_host``: XLA:CPU keeps no allocator statistics, so ``torch.accelerator.get_memory_info()``
  answers (0, 0) and every ``device_map="auto"`` would offload the whole model; the device's memory is the host's,
  so it answers the host's available and total RAM instead (``memory_allocated()`` stays 0: nothing counts it).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hf_tpu.workarounds._tools import Kernels, Patch, tpu_compile_hooks


def _scan(x: torch.Tensor, dim: int, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], fill: Any):
    """Inclusive scan of ``x`` along ``dim`` in log2 steps: step k combines each element with the one k before."""
    if x.dim() == 0:
        return x.clone()
    y = x.movedim(dim, -1)
    n, k = y.shape[-1], 1
    while k < n:
        y = combine(F.pad(y[..., :-k], (k, 0), value=fill), y)
        k *= 2
    return y.movedim(-1, dim).contiguous()


def _accumulating(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is not None:
        return x.to(dtype)
    return x if x.is_floating_point() or x.is_complex() else x.to(torch.int64)  # as torch: integers sum in int64


def cumsum(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _scan(_accumulating(x, dtype), dim, operator.add, 0)


def cumprod(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    return _scan(_accumulating(x, dtype), dim, operator.mul, 1)


def _logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # TorchTPU 0.2.0 has no logaddexp kernel; both -inf stays -inf (a - b would be nan)
    larger = torch.maximum(a, b)
    return torch.where(larger == float("-inf"), larger, larger + torch.log1p(torch.exp(-(a - b).abs())))


def logcumsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    return _scan(x, dim, _logaddexp, float("-inf"))


def _cumulative_extreme(x: torch.Tensor, dim: int, take_later: Callable[..., torch.Tensor], name: str) -> Any:
    """cummax/cummin with torch's choices: ties go to the later index, the first NaN stays."""
    if x.dim() == 0:
        return getattr(torch.return_types, name)((x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)))
    values = x.movedim(dim, -1)
    n = values.shape[-1]
    index = torch.arange(n, device=x.device).expand_as(values)
    k = 1
    while k < n:
        earlier_v, earlier_i = values[..., :-k], index[..., :-k]
        later_v, later_i = values[..., k:], index[..., k:]
        later = ~earlier_v.isnan() & (later_v.isnan() | take_later(later_v, earlier_v))
        values = torch.cat([values[..., :k], torch.where(later, later_v, earlier_v)], dim=-1)
        index = torch.cat([index[..., :k], torch.where(later, later_i, earlier_i)], dim=-1)
        k *= 2
    result = (values.movedim(-1, dim).contiguous(), index.movedim(-1, dim).contiguous())
    return getattr(torch.return_types, name)(result)


def cummax(x: torch.Tensor, dim: int) -> Any:
    return _cumulative_extreme(x, dim, torch.ge, "cummax")


def cummin(x: torch.Tensor, dim: int) -> Any:
    return _cumulative_extreme(x, dim, torch.le, "cummin")


SCANS: dict[str, Callable[..., Any]] = {
    "cumsum": cumsum,
    "cumprod": cumprod,
    "logcumsumexp": logcumsumexp,
    "cummax": cummax,
    "cummin": cummin,
}
_kernels = Kernels()


def _eager_cumsum(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    return cumsum(x, dim, dtype)


def _eager_cumprod(x: torch.Tensor, dim: int, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    return cumprod(x, dim, dtype)


def _eager_cummax(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(cummax(x, dim))  # type: ignore[return-value]


def _eager_cummin(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(cummin(x, dim))  # type: ignore[return-value]


def _rewrite_scans(gm: torch.fx.GraphModule) -> None:
    """Calls of the scan ops in a Dynamo graph (and its subgraphs) become the log-step versions above."""
    targets = {getattr(torch, name): fn for name, fn in SCANS.items()}
    targets.update({getattr(torch.Tensor, name): fn for name, fn in SCANS.items()})
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        changed = False
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target in targets:
                node.target = targets[node.target]
                changed = True
            elif node.op == "call_method" and node.target in SCANS:
                node.op, node.target = "call_function", SCANS[node.target]
                changed = True
        if changed:
            module.recompile()


def scans_apply() -> None:
    _kernels.register(
        {
            "cumsum": _eager_cumsum,
            "cumprod": _eager_cumprod,
            "logcumsumexp": logcumsumexp,
            "cummax": _eager_cummax,
            "cummin": _eager_cummin,
        }
    )
    tpu_compile_hooks.add("scans_as_log_steps", rewrite=_rewrite_scans)


def scans_revert() -> None:
    _kernels.remove()
    tpu_compile_hooks.remove("scans_as_log_steps")


_flash_was_enabled: list[bool] = []


def attention_apply() -> None:
    _flash_was_enabled.append(torch.backends.cuda.flash_sdp_enabled())
    torch.backends.cuda.enable_flash_sdp(False)


def attention_revert() -> None:
    if _flash_was_enabled:
        torch.backends.cuda.enable_flash_sdp(_flash_was_enabled.pop())


_memory_info = Patch(torch.accelerator, "get_memory_info", lambda original: _host_memory_when_unknown(original))


def _host_memory_when_unknown(original: Callable[..., tuple[int, int]]) -> Callable[..., tuple[int, int]]:
    unknown = False  # asked once: each (0, 0) answer also logs TorchTPU's "Failed to get allocator stats"

    def get_memory_info(device_index: Any = None) -> tuple[int, int]:
        nonlocal unknown
        if not unknown:
            answer = original() if device_index is None else original(device_index)
            if answer != (0, 0):
                return answer
            unknown = True
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    return get_memory_info


def fixes() -> tuple[Any, ...]:
    """The registry's records of these workarounds (``hf_tpu.fixes``)."""
    from hf_tpu.fixes import Fix

    return (
        Fix(
            "scans_as_log_steps",
            "xla_cpu_hlo_scan",
            "aten::cumsum, cumprod, logcumsumexp, cummax, cummin (tpu kernels and compiled graphs)",
            "XLA:CPU aborts on the HLO scan TorchTPU lowers them to; log-step scans compute the same",
            scans_apply,
            kind="xla_cpu_limit",
            revert=scans_revert,
        ),
        Fix(
            "attention_without_pallas",
            "xla_cpu_pallas_kernels",
            "torch.nn.functional.scaled_dot_product_attention (flash backend off)",
            "TorchTPU's flash attention is a Pallas kernel XLA:CPU cannot run; its math path runs instead",
            attention_apply,
            kind="xla_cpu_limit",
            revert=attention_revert,
        ),
        Fix(
            "memory_info_from_the_host",
            "xla_cpu_allocator_statistics",
            "torch.accelerator.get_memory_info",
            "XLA:CPU keeps no allocator statistics (it answers 0 free of 0); the device's memory is the host's RAM",
            _memory_info.apply,
            kind="xla_cpu_limit",
            revert=_memory_info.revert,
        ),
    )


def install() -> None:
    """Install every XLA:CPU workaround (only called in that mode)."""
    from hf_tpu import fixes as registry

    table = fixes()
    registry.register(table)
    for fix in table:
        fix = registry.get(fix.name)
        fix.detail = "the real wheel runs on XLA:CPU here (HF_TPU_XLA_CPU=1)"
        registry.install(fix)
