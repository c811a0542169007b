"""The same algorithm with torch ops only (``F.grouped_mm``): the emulated TPU without jax, and CPU tensors."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _grouped(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, transposed: bool) -> torch.Tensor:
    weight = w if transposed else w.transpose(-2, -1)  # grouped_mm wants [E, in, out]
    return torch.nn.functional.grouped_mm(x.to(w.dtype), weight, offs=offsets)


def experts(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    b_up: torch.Tensor | None,
    b_down: torch.Tensor | None,
    gate: Callable[[torch.Tensor], torch.Tensor],
    transposed: bool,
) -> torch.Tensor:
    """Sort by expert, grouped matmuls, ``gate`` in between, mask sentinels, un-sort by gather, f32 sum."""
    num_tokens, top_k = ids.shape
    num_experts = w_up.shape[0]
    sorted_ids, perm = torch.sort(ids.reshape(-1), stable=True)
    experts_range = torch.arange(num_experts, device=ids.device)
    group_sizes = (sorted_ids[:, None] == experts_range[None, :]).sum(0)
    offsets = torch.cumsum(group_sizes, 0, dtype=torch.int32)
    valid = (sorted_ids < num_experts)[:, None]
    clamped = sorted_ids.clamp(max=num_experts - 1)

    y = _grouped(hidden[perm // top_k], w_up, offsets, transposed)
    if b_up is not None:
        y = y + b_up[clamped]
    y = torch.where(valid, y, 0)  # rows past the last offset are uninitialised
    out = _grouped(gate(y), w_down, offsets, transposed)
    if b_down is not None:
        out = out + b_down[clamped]
    out = torch.where(valid, out, 0) * weights.reshape(-1)[perm][:, None]
    out = out[torch.argsort(perm)].float().view(num_tokens, top_k, -1).sum(1)
    return out.to(hidden.dtype)
