"""Train a small language model on the TPU for half a minute, then let it write; the same run on CPU beside it.

    python examples/train_demo.py [--steps N]

A 2-layer Qwen3 learns `examples/data/tpu_primer.txt` character by character, once on "tpu" (the emulated TPU
when no TPU is present) and once on CPU, from the same initial weights and the same batches. Then each model
continues the prompt "TPUs are" greedily. Both should write sentences from the text; the losses agree to
TPU precision (float32 matmuls round to bfloat16 on a chip, so the two runs drift apart slightly).
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers_generate import char_tokenizer

import hf_tpu

TEXT = Path(__file__).with_name("data") / "tpu_primer.txt"
PROMPT = "TPUs are"


def train(device: str, ids: torch.Tensor, steps: int, batch: int = 16, window: int = 96) -> dict:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=258, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, pad_token_id=256, eos_token_id=257, max_position_embeddings=256,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = torch.Generator().manual_seed(0)  # the same windows of text for both devices
    step = torch.compile(model, backend="tpu", fullgraph=True, dynamic=False) if device == "tpu" else model
    losses, first_step = [], 0.0
    start = time.perf_counter()
    with hf_tpu.watch_compiles() as compiles:
        for i in range(steps):
            offsets = torch.randint(0, len(ids) - window - 1, (batch,), generator=batches)
            x = torch.stack([ids[o : o + window] for o in offsets.tolist()]).to(device)
            loss = step(input_ids=x, labels=x).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            if i == 0:
                first_step = time.perf_counter() - start  # on tpu: tracing and compiling the step
    losses = [float(v) for v in torch.stack(losses).cpu()]  # one transfer at the end, not one per step
    seconds = time.perf_counter() - start
    return {"model": model, "losses": losses, "seconds": seconds, "first_step": first_step, "compiles": compiles}


def write(model: torch.nn.Module, tokenizer, device: str, chars: int = 120) -> str:  # noqa: ANN001
    inputs = tokenizer(PROMPT, return_tensors="pt").to(device)
    out = model.generate(**inputs, max_new_tokens=chars, do_sample=False, pad_token_id=256)
    return tokenizer.decode(out[0], skip_special_tokens=True).split("\n")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if not (torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "tpu"):
        import hf_tpu.emulator

        hf_tpu.emulator.enable()

    tokenizer = char_tokenizer()
    text = TEXT.read_text()
    ids = torch.tensor(tokenizer(text)["input_ids"])
    print(f"training a 2-layer Qwen3 on {TEXT.name} ({len(text)} characters), {args.steps} steps of 16 x 96\n")
    runs = {device: train(device, ids, args.steps) for device in ("tpu", "cpu")}
    for device, run in runs.items():
        first, last = run["losses"][0], run["losses"][-1]
        print(
            f"{device:>3}: loss {first:.2f} -> {last:.3f} in {run['seconds']:.1f} s (first step {run['first_step']:.1f} s)"
        )
        print(f"     writes: {write(run['model'], tokenizer, device)!r}")
    tpu, cpu = runs["tpu"], runs["cpu"]
    drift = max(abs(a - b) for a, b in zip(tpu["losses"], cpu["losses"], strict=True))
    compiles = tpu["compiles"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # get_device_name is an experimental TorchTPU API: it says so
        chip = torch.tpu.get_device_name()
    print(
        f"\ntpu vs cpu: losses within {drift:.3f} of each other at every step (bfloat16 matmuls on the chip)\n"
        f"tpu compiles: {compiles.count()} graph(s) for {args.steps} training steps, "
        f"{len(compiles.recompiles)} recompile(s) (one shape, one graph)\n"
        f"tpu HBM: peak {torch.accelerator.max_memory_allocated() / 2**20:.1f} MiB "
        f"of {torch.accelerator.get_memory_info()[1] / 2**30:.0f} GiB on {chip}"
    )


if __name__ == "__main__":
    main()
