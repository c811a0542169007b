"""Trainer on ``"tpu"`` with batches at a few fixed shapes, so that training stops compiling once every bucket ran.

A text dataset's batches are padded to their longest example: another length at nearly every step, and on a TPU
every new shape is an XLA compilation (eager: one per op; compiled: a whole graph, and Dynamo gives up after 8
recompiles). On ``"tpu"``, hf-tpu pads each training and evaluation batch's sequence length up to a power of
two (at least 16), and the training batches' rows up to the batch size (the last, short batch): the extra
columns carry attention mask 0 and label -100, the extra rows label -100 (and mask 1, so attention over them
stays finite). Causal attention never looks ahead and ignored labels add no loss and no gradient, so the losses
are upstream's. Off with ``HF_TPU_TRAIN_BUCKETS=0``; a collator that already fixes the length
(``pad_to_multiple_of``, ``padding="max_length"``) is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

SWITCH = "HF_TPU_TRAIN_BUCKETS"
MIN_BUCKET = 16
# per-token keys and the value that makes a padded position inert (input_ids: the pad token)
_PAD_COLUMNS = {"input_ids": 0, "attention_mask": 0, "labels": -100, "token_type_ids": 0, "position_ids": 0,
                "special_tokens_mask": 1}  # fmt: skip
_PAD_ROWS = dict(_PAD_COLUMNS, attention_mask=1)  # a padded row attends to itself: no all-masked softmax


def enabled() -> bool:
    from hf_tpu import settings

    return settings.get(SWITCH)


def bucket(length: int) -> int:
    """The padded sequence length: the smallest power of two, at least 16, that holds ``length``."""
    size = MIN_BUCKET
    while size < length:
        size *= 2
    return size


def fixes_its_own_length(collator: Any) -> bool:
    """A collator the user configured for fixed shapes already."""
    return (
        getattr(collator, "pad_to_multiple_of", None) is not None or getattr(collator, "padding", None) == "max_length"
    )


def _pad(tensor: torch.Tensor, dim: int, amount: int, value: int, left: bool) -> torch.Tensor:
    shape = list(tensor.shape)
    shape[dim] = amount
    filler = tensor.new_full(shape, value)
    return torch.cat([filler, tensor] if left and dim == 1 else [tensor, filler], dim)


def pad_batch(batch: Any, *, rows: int | None, pad_token_id: int, left: bool = False) -> Any:
    """``batch`` with its sequence length padded to :func:`bucket` and (``rows``) its rows to ``rows``; unchanged
    when it holds a per-token tensor hf-tpu does not know how to pad."""
    if not isinstance(batch, Mapping):
        return batch
    ids = next(
        (batch[k] for k in ("input_ids", "attention_mask", "labels") if isinstance(batch.get(k), torch.Tensor)), None
    )
    if ids is None or ids.dim() < 2:
        return batch
    length, count = ids.shape[1], ids.shape[0]
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 1}
    if any(v.dim() >= 2 and v.shape[1] == length and k not in _PAD_COLUMNS for k, v in tensors.items()):
        return batch  # another per-token input: leave the batch as it is
    target = bucket(length)
    out = dict(batch)
    for key, value in tensors.items():
        if value.dim() >= 2 and value.shape[1] == length and target > length:
            fill = pad_token_id if key == "input_ids" else _PAD_COLUMNS.get(key, 0)
            value = _pad(value, 1, target - length, fill, left)
        if rows is not None and value.shape[0] == count < rows:
            fill = pad_token_id if key == "input_ids" else _PAD_ROWS.get(key, 0)
            value = _pad(value, 0, rows - count, fill, left=False)
        out[key] = value
    return type(batch)(out) if not isinstance(batch, dict) else out


class BucketedCollator:
    """A collator whose batches come out at :func:`bucket` lengths (and ``rows`` rows)."""

    def __init__(
        self, collator: Callable[[list[Any]], Any], *, rows: int | None, pad_token_id: int, left: bool
    ) -> None:
        self.collator, self.rows, self.pad_token_id, self.left = collator, rows, pad_token_id, left

    def __call__(self, features: list[Any]) -> Any:
        return pad_batch(self.collator(features), rows=self.rows, pad_token_id=self.pad_token_id, left=self.left)


def _pad_token(trainer: Any) -> tuple[int, bool]:
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds its tokenizer
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(getattr(trainer.model, "config", None), "pad_token_id", None)
    return int(pad if pad is not None else 0), getattr(tokenizer, "padding_side", "right") == "left"


def wrap_get_dataloader(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Trainer._get_dataloader`` that collates at bucketed shapes on tpu."""
    import functools

    from hf_tpu.plumbing.backend import on_tpu

    @functools.wraps(original)
    def _get_dataloader(self: Any, dataset: Any, description: str, batch_size: int, *args: Any, **kwargs: Any) -> Any:
        collator = self.data_collator
        if not (enabled() and on_tpu(self.args.device)) or collator is None or fixes_its_own_length(collator):
            return original(self, dataset, description, batch_size, *args, **kwargs)
        training = kwargs.get("is_training", args[1] if len(args) > 1 else False)
        pad, left = _pad_token(self)
        self.data_collator = BucketedCollator(
            collator, rows=batch_size if training else None, pad_token_id=pad, left=left
        )
        try:
            return original(self, dataset, description, batch_size, *args, **kwargs)
        finally:
            self.data_collator = collator

    return _get_dataloader
