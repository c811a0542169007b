"""Prompt-length bucketing: pad prompts to a few fixed lengths so compiled decoding is reused.

With ``cache_implementation="static"`` the decode graph's shapes include the cache length
(prompt + new tokens), so every new prompt length is a new XLA compile. Left-padding the
prompt (with its attention mask) to the next bucket keeps the shapes fixed:

    inputs = pad_to_bucket(input_ids, attention_mask, pad_token_id=tok.pad_token_id)
    model.generate(**inputs, cache_implementation="static", max_new_tokens=64)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_BUCKETS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def pad_to_bucket(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    pad_token_id: int = 0,
) -> dict[str, torch.Tensor]:
    """Left-pad ``input_ids`` (batch, length) to the smallest bucket >= length.

    Returns ``{"input_ids", "attention_mask"}`` on the same device, ready for ``generate``.
    Generation with the padded prompt gives the same tokens as without (the mask hides the pad).
    """
    if input_ids.dim() != 2:
        raise ValueError(f"pad_to_bucket: input_ids must be (batch, length), got shape {tuple(input_ids.shape)}.")
    buckets = tuple(buckets)
    if not buckets or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in buckets):
        raise ValueError(
            f"pad_to_bucket: buckets={buckets!r} must be one or more positive ints (prompt lengths), e.g. "
            "buckets=(64, 128, 256)."
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"pad_to_bucket: attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
            f"{tuple(input_ids.shape)}; pass the mask that came with these ids (the tokenizer returns both)."
        )
    length = input_ids.shape[1]
    fitting = sorted(b for b in buckets if b >= length)
    if not fitting:
        raise ValueError(
            f"pad_to_bucket: prompt length {length} exceeds the largest bucket {max(buckets)}; pass larger "
            f"buckets=(..., {length}) or truncate the prompt."
        )
    target = fitting[0]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    pad = target - length
    if pad == 0:
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    ids = torch.full((input_ids.shape[0], pad), pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    mask = torch.zeros((input_ids.shape[0], pad), dtype=attention_mask.dtype, device=attention_mask.device)
    return {"input_ids": torch.cat([ids, input_ids], 1), "attention_mask": torch.cat([mask, attention_mask], 1)}
