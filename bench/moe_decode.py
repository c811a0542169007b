"""MoE decode on the emulated TPU: tokens/s of experts_implementation="tokamax_ragged_dot" vs the default vs
grouped_mm, at batch 1, 8 and 64 (Qwen3-MoE shapes, 64 experts, top-8); and the experts' achieved FLOP/s against
a dense matmul of the same active-expert FLOPs on this CPU (the physical limit).

Run: ``python bench/moe_decode.py``. One run, side by side; prints ratios, never asserts.
"The default" is what generate() decodes with on a TPU: from_pretrained picks grouped_mm and generate() swaps it
for batched_mm on any non-CPU device. grouped_mm is timed by calling the model directly (generate would swap it).
ragged_dot[xla] runs the kernel with XLA's own ragged_dot (tokamax's "xla") instead of the emulator's default
per-group loop: XLA:CPU computes it densely over all experts.
"""

from __future__ import annotations

import argparse
import copy

import torch
from _common import interleaved_medians

# (label, experts_implementation, ragged-dot lowering forced in the kernel or None)
RUNS = (
    ("ragged_dot", "tokamax_ragged_dot", None),
    ("default", "batched_mm", None),
    ("grouped_mm", "grouped_mm", None),
    ("ragged_dot[xla]", "tokamax_ragged_dot", "xla"),
)


def moe_config(layers: int):
    """Qwen3-MoE decode shapes, scaled to a CPU: hidden 256, 64 experts of width 128, top-8."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        moe_intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        max_position_embeddings=128,
    )


def forcing(kernel, forced: str | None, fn):
    """``fn`` with the kernel's ragged-dot lowering forced to ``forced`` (None: the kernel's own choice)."""

    def call():
        kernel.IMPLEMENTATION = forced
        try:
            return fn()
        finally:
            kernel.IMPLEMENTATION = None

    return call


def decode_step(model, batch: int, steps: int, prompt: int = 8):
    """A function that runs one decode step of ``batch`` sequences against a static cache (room for ``steps``)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=prompt + steps)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids.to("tpu"), past_key_values=cache)
    token = ids[:, -1:].to("tpu")

    def step():
        with torch.no_grad():
            logits = model(token, past_key_values=cache).logits  # the cache advances one slot per step
        return logits.cpu()  # wait for the result

    return step


def experts_call(model, batch: int):
    """One call of the first layer's experts on ``batch`` tokens routed by the model's own router."""
    mlp = model.model.layers[0].mlp
    hidden = torch.randn(batch, model.config.hidden_size, generator=torch.Generator().manual_seed(1)).to("tpu")
    with torch.no_grad():
        _, weights, index = mlp.gate(hidden)

    def call():
        with torch.no_grad():
            return mlp.experts(hidden, index, weights).cpu()

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    import hf_tpu.emulator
    import hf_tpu.kernels

    hf_tpu.emulator.enable()
    kernel = hf_tpu.kernels.load_ragged_dot_kernel()
    config = moe_config(args.layers)
    models = {}
    for impl in {impl for _, impl, _ in RUNS}:
        torch.manual_seed(0)  # same weights for every implementation
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), experts_implementation=impl)
        models[impl] = model.eval().to("tpu")
        assert model.get_experts_implementation() == {"": impl}
    top_k, hidden, inter = config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; Qwen3-MoE {args.layers} layers, hidden "
        f"{hidden}, {config.num_experts} experts x {inter}, top-{top_k}, fp32, eager decode\n"
    )

    print("| batch | " + " | ".join(f"{label} tok/s" for label, _, _ in RUNS) + " | vs default | vs grouped_mm |")
    print("|---|" + "---|" * (len(RUNS) + 2))
    for batch in args.batches:
        steps = [
            forcing(kernel, forced, decode_step(models[impl], batch, args.repeats + 1)) for _, impl, forced in RUNS
        ]
        times = interleaved_medians(steps, args.repeats)
        rates = [batch / t for t in times]
        print(
            f"| {batch} | "
            + " | ".join(f"{r:,.0f}" for r in rates)
            + f" | {rates[0] / rates[1]:.2f}x | {rates[0] / rates[2]:.2f}x |"
        )

    print("\nexperts of one layer: achieved GFLOP/s (active-expert FLOPs) vs a dense matmul of the same FLOPs on CPU")
    print("| batch | GFLOP | " + " | ".join(label for label, _, _ in RUNS) + " | dense CPU matmul |")
    print("|---|---|" + "---|" * (len(RUNS) + 1))
    for batch in args.batches:
        rows = batch * top_k
        flops = 2 * rows * hidden * 2 * inter + 2 * rows * inter * hidden
        g = torch.Generator().manual_seed(2)
        x, w_up = torch.randn(rows, hidden, generator=g), torch.randn(hidden, 2 * inter, generator=g)
        a, w_down = torch.randn(rows, inter, generator=g), torch.randn(inter, hidden, generator=g)
        calls = [forcing(kernel, forced, experts_call(models[impl], batch)) for _, impl, forced in RUNS]

        def dense(reps: int = 20) -> None:  # too short to time once: 20 back to back
            for _ in range(reps):
                x @ w_up, a @ w_down

        times = interleaved_medians([*calls, dense], args.repeats * 3)
        times[-1] /= 20
        rates = [flops / t / 1e9 for t in times]
        print(
            f"| {batch} | {flops / 1e9:.3f} | "
            + " | ".join(f"{r:.1f} ({r / rates[-1]:.0%})" for r in rates[:-1])
            + f" | {rates[-1]:.1f} |"
        )


if __name__ == "__main__":
    main()
