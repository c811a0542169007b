"""Per-op cost of the emulated TPU: the small ops a decode step is made of, plain CPU vs "tpu".

Run: ``python bench/tiny_ops.py``. Each op on a 1x1x256 float32 tensor (one token's hidden state), best of
7 repeats of 2000 calls, CPU and tpu side by side in one process; the ratio is the emulator's per-op dispatch
cost (the same CPU kernel runs underneath). Prints ratios, never asserts.
"""

from __future__ import annotations

import timeit

import torch
import torch.nn.functional as F


def main() -> None:
    import hf_tpu.emulator

    hf_tpu.emulator.enable()
    times: dict[str, dict[str, float]] = {}
    for device in ("cpu", "tpu"):
        a = torch.randn(1, 1, 256, device=device)
        b = torch.randn(1, 1, 256, device=device)
        ops = {
            "a + b": lambda: a + b,
            "a * b": lambda: a * b,
            "a * 0.5": lambda: a * 0.5,
            "rsqrt": lambda: torch.rsqrt(a),
            "pow(2).mean(-1)": lambda: a.pow(2).mean(-1, keepdim=True),
            "silu": lambda: F.silu(a),
            "cat": lambda: torch.cat([a, b], -1),
            "a.add_(b)": lambda: a.add_(b, alpha=0.0),
        }
        for name, op in ops.items():
            for _ in range(200):
                op()
            times.setdefault(name, {})[device] = min(timeit.repeat(op, number=2000, repeat=7)) / 2000 * 1e6
    print("op on 1x1x256 fp32       plain CPU   emulated tpu   ratio")
    for name, t in times.items():
        print(f"  {name:20s} {t['cpu']:8.2f} us  {t['tpu']:9.2f} us   {t['tpu'] / t['cpu']:.2f}x")


if __name__ == "__main__":
    main()
