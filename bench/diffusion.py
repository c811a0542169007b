"""Seconds per image, eager vs compiled, for a small SD3-like pipeline on the emulated TPU.

Run: ``python bench/diffusion.py``. One run, side by side; prints ratios and compiles per
resolution, never asserts. The blog's reference on a TPU v6e-4 (Qwen-Image): 8.0 s eager,
3.5 s compiled (2.3x).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from _common import interleaved_medians

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests.diffusers.pipelines builds the pipeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 256])
    args = parser.parse_args()

    import hf_tpu
    import hf_tpu.emulator
    from hf_tpu.diffusers import compile_pipeline
    from tests.diffusers.pipelines import build_sd3, load

    hf_tpu.emulator.enable()
    path = tempfile.mkdtemp(prefix="hf-tpu-bench-sd3-")
    # MMDiT: 4 layers, 4 heads x 32; a 3-level VAE (latents 4x smaller per side).
    build_sd3(path, num_layers=4, heads=4, head_dim=32, vae_channels=(32, 32, 32))
    eager = load("sd3", path).to("tpu")
    compiled = load("sd3", path).to("tpu")
    compile_pipeline(compiled)
    for pipe in (eager, compiled):
        pipe.set_progress_bar_config(disable=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps, guidance on (batch 2)\n")
    print(f"{'size':>9} {'eager s/img':>12} {'compiled s/img':>15} {'speed-up':>9} {'first call s':>13}  compiles")

    for size in args.sizes:

        def run(pipe):
            generator = torch.Generator("tpu").manual_seed(0)
            return pipe("a photo of a cat", height=size, width=size, num_inference_steps=args.steps,
                        output_type="np", generator=generator).images  # fmt: skip

        with hf_tpu.watch_compiles() as first:
            start = time.perf_counter()
            run(compiled)
            first_s = time.perf_counter() - start
        with hf_tpu.watch_compiles() as steady:
            eager_s, compiled_s = interleaved_medians([lambda: run(eager), lambda: run(compiled)], args.repeats)
        per_module = Counter("vae.decoder" if "autoencoders" in c.location else "transformer" for c in first.compiles)
        compiles = ", ".join(f"{k} {v}" for k, v in sorted(per_module.items()))
        print(
            f"{size:>4}x{size:<4} {eager_s:>12.3f} {compiled_s:>15.3f} {eager_s / compiled_s:>8.2f}x {first_s:>13.1f}"
            f"  {compiles}; {steady.count()} after warm-up"
        )


if __name__ == "__main__":
    main()
