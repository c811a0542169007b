"""generate() on the TPU: CPU's tokens, compiled decoding without recompiles (compile_config_defaults_to_inductor), bucketing, a user-compiled forward.

Token-for-token equality with CPU needs float32 matmuls (precision "highest"): at TorchTPU's default a
tiny random model's near-tied logits flip under bfloat16 rounding, on a chip as here.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_tpu
from hf_tpu.transformers import pad_to_bucket
from tests.gaps.test_workarounds import without

pytestmark = pytest.mark.usefixtures("float32_matmuls")


@pytest.fixture(scope="module")
def models(qwen3_dir):
    cpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")
    return cpu, tpu


def prompt(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(1, 128, (batch, length), generator=torch.Generator().manual_seed(length))


def test_greedy_matches_cpu_and_seeded_sampling_is_reproducible(models):
    cpu, tpu = models
    ids = prompt(7)
    greedy = dict(max_new_tokens=10, do_sample=False)
    assert tpu.generate(ids.to("tpu"), **greedy).cpu().tolist() == cpu.generate(ids, **greedy).tolist()
    # Sampling draws through the device's seeded generator (hf-tpu's seeded_multinomial on TorchTPU, whose
    # own multinomial ignores the seed), so it is reproducible, though not CPU's random stream.
    sampling = dict(max_new_tokens=10, do_sample=True, top_k=20, temperature=0.9)
    runs = []
    for seed in (11, 11, 12):
        torch.manual_seed(seed)
        runs.append(tpu.generate(ids.to("tpu"), **sampling).cpu().tolist())
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert all(0 <= token < 128 for row in runs[0] for token in row)


def fresh(qwen3_dir) -> transformers.PreTrainedModel:
    """A model whose generate() compiled nothing yet (transformers keeps a static cache's length per model)."""
    torch._dynamo.reset()
    return transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")


def test_static_cache_compiles_once_across_steps_and_calls(models, qwen3_dir):
    cpu, _ = models
    tpu = fresh(qwen3_dir)
    ids = prompt(9)
    kwargs = dict(max_new_tokens=12, do_sample=False, cache_implementation="static")
    with hf_tpu.watch_compiles() as warm_up:
        first = tpu.generate(ids.to("tpu"), **kwargs)
    with hf_tpu.watch_compiles() as after:
        second = tpu.generate(ids.to("tpu"), **kwargs)
    assert warm_up.count() >= 1 and after.count() == 0, (str(warm_up), str(after))
    assert first.cpu().tolist() == second.cpu().tolist() == cpu.generate(ids, max_new_tokens=12).tolist()


def test_explicit_compile_config_suits_tpu(models):
    # compile_config_defaults_to_inductor: CompileConfig() defaults to inductor/reduce-overhead, which TPU refuses; it must just work.
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
    lengths = [5, 9, 13]
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
    print(f"\ncompiles for {len(lengths)} prompt lengths: {plain.count()} without bucketing, {bucketed.count()} with")
    assert plain.count() >= len(lengths) and bucketed.count() == 1
    assert "dim 2 changed" in plain.recompiles[0].reason  # the cache length followed the prompt


def test_pad_to_bucket_errors_name_the_fix():
    with pytest.raises(ValueError, match="exceeds the largest bucket 16.*buckets="):
        pad_to_bucket(torch.ones(1, 20, dtype=torch.long), buckets=(8, 16))


def test_user_compiled_forward_with_a_static_cache(models):
    # A user compiles model.forward and decodes with a StaticCache built off the chip: the compiled prefill sets the
    # cache up, so the cache's CPU cumulative_length enters the graph (gap cpu_tensor_into_compiled_graph: TorchTPU
    # refuses it; hf-tpu's compiled_graphs_take_cpu_inputs moves it to the chip).
    cpu, tpu = models
    ids = prompt(6, batch=1)

    def decode(forward, model, device: str) -> list[int]:
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        logits = forward(input_ids=ids.to(device), past_key_values=cache, use_cache=True).logits
        tokens = [int(logits[0, -1].argmax())]
        for _ in range(3):
            step = torch.tensor([[tokens[-1]]], device=device)
            tokens.append(int(forward(input_ids=step, past_key_values=cache, use_cache=True).logits[0, -1].argmax()))
        return tokens

    expected = decode(cpu.forward, cpu, "cpu")
    compiled = torch.compile(tpu.forward, backend="tpu", fullgraph=True, dynamic=False)
    with without("compiled_graphs_take_cpu_inputs", "cpu_tensor_into_compiled_graph") as gap:
        if gap:
            torch._dynamo.reset()
            with pytest.raises(RuntimeError, match="expected tensor to be on tpu, got cpu"):
                decode(compiled, tpu, "tpu")
    torch._dynamo.reset()
    assert decode(compiled, tpu, "tpu") == expected
