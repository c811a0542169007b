"""Three gaps of ``F.scaled_dot_product_attention`` on tpu, closed by one wrapper (each part switchable):

- ``attention_math_for_differentiable_mask`` (gap ``differentiable_attention_mask``): a mask that
  requires grad goes to the math path (matmuls and softmax), which differentiates it, instead of the
  flash kernel that refuses it;
- ``attention_math_at_highest`` (gap ``attention_precision``): float32 attention at matmul precision
  "highest" goes to the math path, whose matmuls honour the precision (the fused kernel computes in
  bfloat16 whatever is asked);
- ``attention_zero_fully_masked_rows`` (gap ``fully_masked_attention_row``): with a boolean mask, query
  rows masked everywhere come back as zeros, as on CPU and CUDA.

Other calls, and every non-tpu call, go to PyTorch's function unchanged.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Wrapped

DIFFERENTIABLE_MASK = "attention_math_for_differentiable_mask"
AT_HIGHEST = "attention_math_at_highest"
FULLY_MASKED_ROWS = "attention_zero_fully_masked_rows"

_active: set[str] = set()
_wrapped: Wrapped | None = None


def _precision_is_highest() -> bool:
    return torch.get_float32_matmul_precision() == "highest"


def _constant_while_tracing(dynamo: ModuleType) -> None:
    """Dynamo cannot trace the precision query: make it a constant of the graph (the graph keeps the precision
    it was compiled at, as XLA's does). Done when Dynamo is imported, which costs a second."""
    global _precision_is_highest
    _precision_is_highest = dynamo.assume_constant_result(_precision_is_highest)


def _wrap(sdpa: Any) -> Any:
    def scaled_dot_product_attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if query.device.type != "tpu":
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        math = (
            DIFFERENTIABLE_MASK in _active
            and attn_mask is not None
            and attn_mask.requires_grad
            and torch.is_grad_enabled()
        ) or (AT_HIGHEST in _active and query.dtype == torch.float32 and _precision_is_highest())
        if math:
            mask = attn_mask
            if mask is not None and mask.dtype == torch.bool:  # the math kernel adds its mask (as SDPA's composite)
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(~mask, float("-inf"))
            out = torch.ops.aten._scaled_dot_product_attention_math(
                query, key, value, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )[0]
        else:
            out = sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if FULLY_MASKED_ROWS in _active and attn_mask is not None and attn_mask.dtype == torch.bool:
            out = out.masked_fill(~attn_mask.any(-1, keepdim=True), 0.0)
        return out

    scaled_dot_product_attention.__doc__ = sdpa.__doc__
    return scaled_dot_product_attention


def _enable(name: str) -> None:
    global _wrapped
    _active.add(name)
    if _wrapped is None:
        from hf_tpu.plumbing.import_hooks import when_imported

        when_imported("torch._dynamo", _constant_while_tracing)
        _wrapped = Wrapped(F, "scaled_dot_product_attention", _wrap)


def _disable(name: str) -> None:
    global _wrapped
    _active.discard(name)
    if not _active and _wrapped is not None:
        _wrapped.restore()
        _wrapped = None


def fix(name: str) -> tuple[Any, Any]:
    """``(apply, revert)`` for one of the three parts."""
    return (lambda: _enable(name)), (lambda: _disable(name))


_SDPA = "torch.nn.functional.scaled_dot_product_attention (tpu tensors)"
WORKAROUNDS = (
    Fix.workaround(FULLY_MASKED_ROWS, "fully_masked_attention_row", _SDPA,
                   "query rows masked everywhere come back as zeros, as on CPU and CUDA", *fix(FULLY_MASKED_ROWS)),
    Fix.workaround(DIFFERENTIABLE_MASK, "differentiable_attention_mask", _SDPA,
                   "a mask that requires grad takes the math path, which differentiates it", *fix(DIFFERENTIABLE_MASK)),
    Fix.workaround(AT_HIGHEST, "attention_precision", _SDPA,
                   "float32 attention at precision 'highest' takes the math path, which honours it", *fix(AT_HIGHEST)),
)  # fmt: skip
