"""Loading a ~500 MB checkpoint: device_map="tpu" vs device_map="cpu" vs a raw safetensors read.

Run: ``python bench/load.py``. Each measurement runs in a fresh process (clean RSS and page
cache state is shared: the file is read once first so all three read from the page cache).
Prints times, ratios and peak RSS above the process's baseline. On the emulator, device
memory *is* host memory, so "host overhead" = peak RSS - bytes on the device.

Two numbers per loader: "first in a process" includes what the first ``from_pretrained`` of a process pays
once whatever the checkpoint's size (importing the model's module, transformers' loading machinery, Dynamo and
DTensor: ~3 s on 2 cores), and "loading" is a second process that paid those imports with a tiny checkpoint of
the same class first, so it measures what grows with the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

MEASURE = r"""
import json, resource, sys, time, gc
import torch
mode, path, warm = sys.argv[1], sys.argv[2], sys.argv[3]
import transformers, safetensors.torch
if warm != "-":  # pay the one-time imports with a tiny checkpoint of the same class
    transformers.AutoModelForCausalLM.from_pretrained(warm, device_map=mode)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
gc.collect()
base = rss()
start = time.perf_counter()
if mode == "raw":
    # load_file maps the file lazily: copy each tensor out, as a real load into memory does
    tensors = {k: v.clone() for k, v in safetensors.torch.load_file(path + "/model.safetensors").items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map=mode)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
elapsed = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
device = torch.accelerator.memory_allocated() if mode == "tpu" else 0
print(json.dumps({"s": elapsed, "peak_above_base": peak - base, "nbytes": nbytes, "device": device}))
"""


def measure(mode: str, path: str, warm: str = "-") -> dict:
    env = dict(os.environ)
    env["HF_TPU_EMULATE"] = "1" if mode == "tpu" else "0"
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, mode, path, warm],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
    )
    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as tiny:
        small = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
        Qwen3ForCausalLM(small).save_pretrained(tiny)
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
        model = model.to_empty(device="cpu")
        for p in model.parameters():
            p.data.normal_(0, 0.02)
        model.save_pretrained(path)
        del model
        size = os.path.getsize(os.path.join(path, "model.safetensors"))
        measure("raw", path)  # warm the page cache so every run reads from memory
        runs = {mode: measure(mode, path) for mode in ("raw", "cpu", "tpu")}
        warm = {mode: measure(mode, path, tiny) for mode in ("cpu", "tpu")}
    mib = 2**20
    print(f"checkpoint {size / mib:.0f} MiB (fp32), page cache warm")
    for mode, r in runs.items():
        label = {
            "raw": "safetensors load_file + copy",
            "cpu": 'from_pretrained(device_map="cpu")',
            "tpu": 'from_pretrained(device_map="tpu")',
        }[mode]
        extra = ""
        if mode == "tpu":
            extra = f", host overhead (peak RSS - device bytes) {(r['peak_above_base'] - r['device']) / mib:.0f} MiB"
        print(
            f"  {label:<36} {r['s']:6.2f} s  ({r['s'] / runs['raw']['s']:.2f}x raw)  "
            f"peak RSS +{r['peak_above_base'] / mib:.0f} MiB{extra}"
        )
    print("  after the first from_pretrained of the process (imports paid with a tiny checkpoint of the class):")
    for mode, r in warm.items():
        extra = f", host overhead {(r['peak_above_base'] - r['device']) / mib:.0f} MiB" if mode == "tpu" else ""
        print(f"  {mode + ' loading':<36} {r['s']:6.2f} s  ({r['s'] / runs['raw']['s']:.2f}x raw){extra}")
    print(
        f"  tpu loading vs raw read: {warm['tpu']['s'] / runs['raw']['s']:.2f}x (goal <= 2x); first load in a "
        f"process: {runs['tpu']['s'] / runs['raw']['s']:.1f}x, of which {runs['tpu']['s'] - warm['tpu']['s']:.1f} s "
        "is one-time imports"
    )


if __name__ == "__main__":
    main()
