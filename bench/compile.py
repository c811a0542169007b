"""torch.compile(backend="tpu") on the emulated TPU: speed-up over eager, compile time, recompiles.

Run: ``python bench/compile.py``. One run, side by side; prints ratios, never asserts.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import interleaved_medians, qwen3_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    from transformers import Qwen3ForCausalLM

    import hf_tpu
    import hf_tpu.emulator

    hf_tpu.emulator.enable()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    for hidden, layers, batch, seq in ((128, 2, 4, 64), (256, 4, 4, 128)):
        config = qwen3_config(hidden, layers)
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).eval().to("tpu")
        ids = torch.randint(0, 1024, (batch, seq)).to("tpu")
        compiled = torch.compile(model, backend="tpu", fullgraph=True)
        with torch.no_grad():
            with hf_tpu.watch_compiles() as warm_up:
                start = time.perf_counter()
                compiled(ids)
                compile_s = time.perf_counter() - start
            model(ids)
            with hf_tpu.watch_compiles() as after:
                eager, fast = interleaved_medians([lambda: model(ids), lambda: compiled(ids)], args.repeats)
                for _ in range(20):
                    compiled(ids)
        print(
            f"Qwen3 forward hidden={hidden} layers={layers} {batch}x{seq}: eager {eager * 1e3:.1f} ms, "
            f"compiled {fast * 1e3:.1f} ms, speed-up {eager / fast:.2f}x; first call {compile_s:.1f} s "
            f"({warm_up.count()} graph); compiles during {args.repeats + 20} more same-shape calls: {after.count()}"
        )
    stats = torch.tpu._get_cache_stats()
    print(
        f"\ncache: {stats.num_compilations} compilations, {stats.num_cache_reqs} requests, {stats.num_cache_hits} hits"
    )


if __name__ == "__main__":
    main()
