"""generate() on the emulated TPU: CPU's tokens, compiled decoding without recompiles (G11), bucketing."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_tpu
from hf_tpu.transformers import pad_to_bucket


@pytest.fixture(scope="module")
def models(qwen3_dir):
    cpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")
    return cpu, tpu


def prompt(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(1, 128, (batch, length), generator=torch.Generator().manual_seed(length))


def test_greedy_and_seeded_sampling_match_cpu(models):
    cpu, tpu = models
    ids = prompt(7)
    greedy = dict(max_new_tokens=10, do_sample=False)
    assert tpu.generate(ids.to("tpu"), **greedy).cpu().tolist() == cpu.generate(ids, **greedy).tolist()
    sampling = dict(max_new_tokens=10, do_sample=True, top_k=20, temperature=0.9)
    torch.manual_seed(11)
    expected = cpu.generate(ids, **sampling)
    torch.manual_seed(11)  # seeds the device generator too; it draws with CPU's engine
    actual = tpu.generate(ids.to("tpu"), **sampling)
    assert actual.cpu().tolist() == expected.tolist()


def test_static_cache_compiles_once_across_steps_and_calls(models):
    cpu, tpu = models
    ids = prompt(9)
    kwargs = dict(max_new_tokens=12, do_sample=False, cache_implementation="static")
    with hf_tpu.watch_compiles() as warm_up:
        first = tpu.generate(ids.to("tpu"), **kwargs)
    with hf_tpu.watch_compiles() as after:
        second = tpu.generate(ids.to("tpu"), **kwargs)
    assert warm_up.count() >= 1 and after.count() == 0, (str(warm_up), str(after))
    assert first.cpu().tolist() == second.cpu().tolist() == cpu.generate(ids, max_new_tokens=12).tolist()


def test_explicit_compile_config_suits_tpu(models):
    # G11: CompileConfig() defaults to inductor/reduce-overhead, which TPU refuses; it must just work.
    cpu, tpu = models
    ids = prompt(5)
    out = tpu.generate(
        ids.to("tpu"),
        max_new_tokens=6,
        do_sample=False,
        cache_implementation="static",
        compile_config=transformers.CompileConfig(),
    )
    assert out.cpu().tolist() == cpu.generate(ids, max_new_tokens=6, do_sample=False).tolist()


def test_bucketing_reuses_the_graph_and_keeps_tokens(models, qwen3_dir):
    cpu, _ = models
    # Growing prompt lengths on fresh models (transformers reuses a static cache that is already long enough).
    lengths = [5, 7, 9, 11, 13]
    kwargs = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    torch._dynamo.reset()
    tpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")
    with hf_tpu.watch_compiles() as plain:
        for n in lengths:
            tpu.generate(prompt(n).to("tpu"), **kwargs)
    torch._dynamo.reset()
    tpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")
    with hf_tpu.watch_compiles() as bucketed:
        for n in lengths:
            ids = prompt(n)
            out = tpu.generate(**pad_to_bucket(ids.to("tpu"), buckets=(16,)), **kwargs)
            expected = cpu.generate(ids, max_new_tokens=6, do_sample=False)
            assert out[:, 16:].cpu().tolist() == expected[:, n:].tolist()
    print(f"\ncompiles for 5 prompt lengths: {plain.count()} without bucketing, {bucketed.count()} with")
    assert plain.count() >= len(lengths) and bucketed.count() == 1
    assert "dim 2 changed" in plain.recompiles[0].reason  # the cache length followed the prompt


def test_pad_to_bucket_errors_name_the_fix():
    with pytest.raises(ValueError, match="exceeds the largest bucket 16.*buckets="):
        pad_to_bucket(torch.ones(1, 20, dtype=torch.long), buckets=(8, 16))
