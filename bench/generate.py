"""generate() tokens/s on the emulated TPU: eager vs compiled decoding (static cache), and recompiles.

Run: ``python bench/generate.py``. One run, side by side; prints ratios, never asserts.
"""

from __future__ import annotations

import tempfile
import time

import torch
from _common import qwen3_config


def main() -> None:
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    import hf_tpu
    import hf_tpu.emulator
    from hf_tpu.transformers import pad_to_bucket

    hf_tpu.emulator.enable()
    config = qwen3_config(256, 4, vocab=4096)
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    Qwen3ForCausalLM(config).save_pretrained(path)
    cpu = AutoModelForCausalLM.from_pretrained(path)
    tpu = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
    new_tokens = 64
    ids = torch.randint(0, 4096, (1, 16))

    def run(model, device, **kw):
        start = time.perf_counter()
        out = model.generate(
            ids.to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kw
        )
        return out, new_tokens / (time.perf_counter() - start)

    run(cpu, "cpu")
    _, cpu_tps = run(cpu, "cpu")
    run(tpu, "tpu")
    _, eager_tps = run(tpu, "tpu")
    with hf_tpu.watch_compiles() as warm:
        start = time.perf_counter()
        run(tpu, "tpu", cache_implementation="static")
        warm_s = time.perf_counter() - start
    with hf_tpu.watch_compiles() as steady:
        results = [run(tpu, "tpu", cache_implementation="static")[1] for _ in range(3)]
    compiled_tps = max(results)
    print(f"Qwen3 hidden=256 layers=4, batch 1, prompt 16, {new_tokens} new tokens")
    print(f"  plain CPU eager          {cpu_tps:8.1f} tok/s")
    print(f"  emulated tpu eager       {eager_tps:8.1f} tok/s   ({eager_tps / cpu_tps:.2f}x CPU)")
    print(f"  emulated tpu compiled    {compiled_tps:8.1f} tok/s   ({compiled_tps / eager_tps:.2f}x eager)")
    print(f"  warm-up call {warm_s:.1f} s, {warm.count()} graph(s); recompiles in 3 more calls: {steady.count()}")

    lengths = [5, 9, 13, 17, 21]
    for bucketed in (False, True):
        torch._dynamo.reset()
        model = AutoModelForCausalLM.from_pretrained(path, device_map="tpu")
        with hf_tpu.watch_compiles() as report:
            for n in lengths:
                prompt = torch.randint(0, 4096, (1, n)).to("tpu")
                inputs = pad_to_bucket(prompt, buckets=(32,)) if bucketed else {"input_ids": prompt}
                model.generate(**inputs, max_new_tokens=8, do_sample=False, cache_implementation="static")
        label = "with bucketing (32)" if bucketed else "without bucketing"
        print(f"  prompt lengths {lengths}: {report.count()} compiles {label}")


if __name__ == "__main__":
    main()
