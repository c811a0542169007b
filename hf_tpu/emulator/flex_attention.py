"""``flex_attention`` on tpu tensors, as TorchTPU's import patches it: masked SDPA.

TorchTPU 0.2.0 (``_internal/compile/__init__.py``) lets tpu tensors past flex_attention's device check and, for
a mask-only call (no ``score_mod``, no log-sum-exp requested, bfloat16 or float32), computes attention with
``scaled_dot_product_attention`` and an additive bias built once per BlockMask from its ``mask_mod``. Other
calls run flex_attention's own dense implementation on the device. The emulator does the same, on import of
``torch.nn.attention.flex_attention``.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch


def _bias(block_mask: Any, q_len: int, kv_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    from torch.nn.attention.flex_attention import create_mask

    cache = {} if torch.compiler.is_compiling() else block_mask.__dict__.setdefault("_tpu_sdpa_mask_cache", {})
    key = (q_len, kv_len, dtype, device)
    if key not in cache:
        batch, heads = block_mask.kv_num_blocks.shape[:2]
        with torch.no_grad():
            allowed = create_mask(block_mask.mask_mod, batch, heads, q_len, kv_len, device=device)
            cache[key] = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
    return cache[key]


def patch(module: ModuleType) -> None:
    """Applied when ``torch.nn.attention.flex_attention`` is imported."""
    if getattr(module.flex_attention, "_hf_tpu_patched", False):
        return
    validate = module._validate_device

    def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "tpu":
            validate(query, key, value)

    module._validate_device = _validate_device
    original = module.flex_attention

    @functools.wraps(original)
    def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,  # noqa: ANN001, ANN202
                       return_lse=False, kernel_options=None, *, return_aux=None):  # fmt: skip
        wants_aux = return_lse or (
            return_aux is not None and (getattr(return_aux, "lse", False) or getattr(return_aux, "max_scores", False))
        )
        if query.device.type == "tpu" and score_mod is None and not wants_aux and query.dtype in (
            torch.bfloat16, torch.float32
        ):  # fmt: skip
            bias = None
            if block_mask is not None:
                bias = _bias(block_mask, query.shape[-2], key.shape[-2], query.dtype, query.device)
            out = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, attn_mask=bias, scale=scale, enable_gqa=enable_gqa
            )
            return (out, module.AuxOutput()) if return_aux is not None else out
        return original(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse, kernel_options,
                        return_aux=return_aux)  # fmt: skip

    flex_attention._hf_tpu_patched = True  # type: ignore[attr-defined]
    module.flex_attention = flex_attention


def install() -> None:
    from hf_tpu.plumbing.import_hooks import when_imported

    when_imported("torch.nn.attention.flex_attention", patch)
