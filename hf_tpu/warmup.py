"""Warm-up ahead of time: compile every shape a model will meet before the first request, as vLLM's TPU backend
precompiles its buckets, so that serving starts warm.

    report = hf_tpu.warm_up_generate(model, max_prompt_length=512, max_new_tokens=64, batch_sizes=(1, 4))
    print(report)   # 12 runs: 2 graph(s), 1,863 XLA compilation(s) in 48.1 s

    hf_tpu.warm_up_pipeline(pipe, resolutions=[(512, 512), (1024, 1024)], num_inference_steps=[4, 28])

``generate`` on ``"tpu"`` pads prompts to power-of-two buckets on a static cache (``hf_tpu.transformers.
generate_shapes``); warming up runs one request per bucket and batch size, the largest first (the static cache
only grows, so every later shape is built against its final size), each decoding ``max_new_tokens``. A request
within those limits then compiles nothing; with TorchTPU's persistent cache (``hf_tpu.plumbing.compile_cache``) neither
does the next process's warm-up.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hf_tpu.compilations import count_compilations


@dataclass
class WarmUp:
    """What a warm-up ran and paid."""

    runs: int = 0
    graphs: int = 0  # torch.compile graphs built (transformers compiles static-cache decoding)
    compilations: int = 0  # XLA compilations: TorchTPU's count (the emulator models it)
    compile_seconds: float = 0.0
    seconds: float = 0.0

    def __str__(self) -> str:
        return (
            f"warm-up: {self.runs} run(s), {self.graphs} graph(s), {self.compilations:,} XLA compilation(s) "
            f"({self.compile_seconds:.1f} s compiling) in {self.seconds:.1f} s"
        )


def _check_on_tpu(what: str, device: Any) -> None:
    if getattr(device, "type", None) != "tpu":
        raise ValueError(
            f"hf_tpu.{what}: the model is on {device}, not on the TPU: move it first (model.to('tpu') or "
            "device_map='tpu'); warming up compiles the TPU's programs."
        )


def _positive(what: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"hf_tpu.{what}: {name}={value!r} must be a positive int.")
    return value


def _run_all(what: str, calls: Sequence[tuple[str, Any]], progress: bool) -> WarmUp:
    from huggingface_hub.utils import tqdm

    from hf_tpu.recompiles import watch_compiles

    report = WarmUp()
    start = time.perf_counter()
    with watch_compiles() as graphs, count_compilations() as paid:
        bar = tqdm(calls, desc=what, unit="run", disable=not progress, file=sys.stderr)
        for label, call in bar:
            bar.set_postfix_str(label)
            call()
            report.runs += 1
    report.graphs = graphs.count()
    report.compilations, report.compile_seconds = paid.compilations, paid.seconds
    report.seconds = time.perf_counter() - start
    if progress:
        sys.stderr.write(f"hf-tpu {report}\n")
    return report


def prompt_buckets(max_prompt_length: int) -> list[int]:
    """The padded prompt lengths generate() on tpu uses for prompts of 1..max_prompt_length tokens."""
    from hf_tpu.transformers.generate_shapes import bucket

    buckets = {bucket(0)}
    size = bucket(0)
    while size <= max_prompt_length:
        size = bucket(size)
        buckets.add(size)
    return sorted(b for b in buckets if b <= bucket(max_prompt_length))


def warm_up_generate(
    model: Any,
    *,
    max_prompt_length: int,
    max_new_tokens: int,
    batch_sizes: Iterable[int] = (1,),
    progress: bool = True,
    **generate_kwargs: Any,
) -> WarmUp:
    """Compile what ``model.generate`` meets for prompts of up to ``max_prompt_length`` tokens, ``batch_sizes``
    rows and up to ``max_new_tokens`` new tokens. ``generate_kwargs`` are those of the requests to come
    (``do_sample``, ``top_k``...: sampling runs other ops than greedy search)."""
    from hf_tpu.transformers import generate_shapes

    what = "warm_up_generate"
    _check_on_tpu(what, getattr(model, "device", None))
    _positive(what, "max_prompt_length", max_prompt_length)
    _positive(what, "max_new_tokens", max_new_tokens)
    sizes = sorted({_positive(what, "batch_sizes", b) for b in batch_sizes}, reverse=True)
    if not sizes:
        raise ValueError(f"hf_tpu.{what}: batch_sizes is empty; give the batch sizes requests will have, e.g. (1, 4).")
    for name in ("input_ids", "inputs", "attention_mask", "max_length", "min_new_tokens"):
        if name in generate_kwargs:
            raise ValueError(f"hf_tpu.{what}: {name}= is chosen per bucket by the warm-up; leave it out.")
    probe = torch.ones((1, 1), dtype=torch.long, device=model.device)
    if generate_shapes.plan(model, {"inputs": probe}, dict(generate_kwargs, max_new_tokens=max_new_tokens)) is None:
        raise ValueError(
            f"hf_tpu.{what}: generate() on this model does not run at fixed shapes, so no warm-up covers a new "
            f"prompt length (HF_TPU_GENERATE_BUCKETS is off, the model cannot use a static cache, or "
            f"{sorted(generate_kwargs)} choose the cache). Warm up by calling generate() with the requests to come."
        )
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    token = min(1, vocab - 1)

    def request(rows: int, length: int) -> Any:
        ids = torch.full((rows, length), token, dtype=torch.long, device=model.device)
        # min_new_tokens: decode every step even if the end-of-sequence token comes first
        return lambda: model.generate(
            ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, **generate_kwargs
        )

    calls = [
        (f"batch {rows}, prompt bucket {size}", request(rows, size - 1))
        for size in reversed(prompt_buckets(max_prompt_length))
        for rows in sizes
    ]
    return _run_all(what, calls, progress)


def warm_up_pipeline(
    pipe: Any,
    *,
    resolutions: Iterable[tuple[int, int]],
    num_inference_steps: Iterable[int],
    prompt: str = "warm-up",
    progress: bool = True,
    **call_kwargs: Any,
) -> WarmUp:
    """Run a diffusers pipeline once per resolution (height, width) and step count, so that its compiled
    transformer, its scheduler's eager steps and its VAE decoder are warm for each."""
    what = "warm_up_pipeline"
    _check_on_tpu(what, getattr(pipe, "device", None))
    shapes = [(int(h), int(w)) for h, w in resolutions]
    steps = sorted({_positive(what, "num_inference_steps", s) for s in num_inference_steps})
    if not shapes or not steps:
        raise ValueError(f"hf_tpu.{what}: give at least one resolution and one step count.")
    for name in ("height", "width", "num_inference_steps"):
        if name in call_kwargs:
            raise ValueError(f"hf_tpu.{what}: {name}= is chosen per run by the warm-up; leave it out.")

    def run(height: int, width: int, count: int) -> Any:
        return lambda: pipe(prompt, height=height, width=width, num_inference_steps=count, **call_kwargs)

    calls = [(f"{h}x{w}, {s} steps", run(h, w, s)) for h, w in shapes for s in steps]
    return _run_all(what, calls, progress)
