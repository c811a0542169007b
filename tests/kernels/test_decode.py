"""Decoding keeps "tokamax_ragged_dot" (moe_default_grouped_mm: generate() swaps only grouped_mm, for batched_mm), and compiled
decoding with a static cache compiles once: 0 recompiles per step and per call."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_tpu
from hf_tpu.transformers.generate_shapes import bucket

IMPL = "tokamax_ragged_dot"


@pytest.fixture(scope="module")
def models(qwen3_moe_dir):
    cpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, experts_implementation="eager")
    tpu = transformers.AutoModelForCausalLM.from_pretrained(
        qwen3_moe_dir, device_map="tpu", experts_implementation=IMPL
    )
    return cpu, tpu


def prompt(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(1, 128, (batch, length), generator=torch.Generator().manual_seed(length))


def implementations_seen(model, ids, **kwargs) -> set[tuple[str, int]]:
    """(experts implementation, tokens) of every experts call during generate()."""
    seen = set()

    def record(module, args):
        seen.add((module.config._experts_implementation, args[0].shape[0]))

    hooks = [layer.mlp.experts.register_forward_pre_hook(record) for layer in model.model.layers]
    try:
        model.generate(ids, max_new_tokens=3, do_sample=False, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_decode_keeps_the_custom_implementation(models, qwen3_moe_dir):
    _, tpu = models
    ids = prompt(5).to("tpu")
    prefill = 2 * bucket(5)  # generate() on "tpu" pads the 5-token prompt to its bucket (hf_tpu generate_shapes)
    assert implementations_seen(tpu, ids) == {(IMPL, prefill), (IMPL, 2)}  # prefill 2 rows, decode 2x1
    # The default, for contrast: transformers decodes with batched_mm on any non-CPU device.
    default = transformers.AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, device_map="tpu")
    assert implementations_seen(default, ids) == {("grouped_mm", prefill), ("batched_mm", 2)}


def test_compiled_static_decode_has_no_recompiles(models):
    cpu, tpu = models
    ids = prompt(6)
    kwargs = dict(max_new_tokens=10, do_sample=False, cache_implementation="static")
    with hf_tpu.watch_compiles() as warm_up:
        first = tpu.generate(ids.to("tpu"), **kwargs)
    with hf_tpu.watch_compiles() as after:
        second = tpu.generate(ids.to("tpu"), **kwargs)
    assert warm_up.count() >= 1 and after.count() == 0, (str(warm_up), str(after))
    assert first.cpu().tolist() == second.cpu().tolist() == cpu.generate(ids, max_new_tokens=10).tolist()
