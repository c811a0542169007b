"""Shared by the bench scripts: the small Qwen3 shapes they time, and interleaved timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def qwen3_config(hidden: int, layers: int, vocab: int = 1024):
    """A Qwen3 config of the given width and depth (8 heads, 4 KV heads, MLP 3x hidden)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=hidden // 8,
    )


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, calls interleaved so machine noise hits all alike (one warm-up each)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, bucket in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
