"""What the emulated TPU costs: model forward/generate vs plain CPU, the faithful profile vs ideal,
core build, autoload.

Run: ``python bench/emulator_overhead.py`` (add ``--skip-build`` to skip the cold build,
which takes minutes). Everything is measured side by side in this one run; the ratios
are what to compare across machines, not the absolute times. The profile comparison runs each
profile in its own process (the profile is chosen at start-up), alternating, medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable

import torch
from _common import interleaved_medians, qwen3_config


def _import_time(env_extra: dict[str, str], repeats: int = 7) -> float:
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"} | env_extra
    times = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", "import time; t=time.perf_counter(); import torch; print(time.perf_counter()-t)"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def bench_model(repeats: int) -> None:
    from transformers import Qwen3ForCausalLM

    for hidden, layers, batch, seq in ((128, 2, 4, 64), (512, 4, 4, 128)):
        config = qwen3_config(hidden, layers)
        torch.manual_seed(0)
        cpu = Qwen3ForCausalLM(config).eval()
        tpu = Qwen3ForCausalLM(config).eval()
        tpu.load_state_dict(cpu.state_dict())
        tpu.to("tpu")
        ids = torch.randint(0, 1024, (batch, seq))
        ids_tpu = ids.to("tpu")
        with torch.no_grad():
            t_cpu, t_tpu = interleaved_medians([lambda: cpu(ids), lambda: tpu(ids_tpu)], repeats)
        label = f"forward  hidden={hidden} layers={layers} batch={batch}x{seq}"
        print(
            f"{label:<48} cpu {t_cpu * 1e3:8.1f} ms   tpu(emulated) {t_tpu * 1e3:8.1f} ms   ratio {t_tpu / t_cpu:.2f}x"
        )
        gen = {"max_new_tokens": 32, "do_sample": False, "min_new_tokens": 32}
        short = ids[:, :16]
        t_cpu, t_tpu = interleaved_medians(
            [lambda: cpu.generate(short, **gen), lambda: tpu.generate(short.to("tpu"), **gen)], max(1, repeats // 3)
        )
        label = f"generate hidden={hidden} layers={layers} 32 tokens"
        print(
            f"{label:<48} cpu {t_cpu * 1e3:8.1f} ms   tpu(emulated) {t_tpu * 1e3:8.1f} ms   ratio {t_tpu / t_cpu:.2f}x"
        )


def _profile_workloads(repeats: int) -> dict[str, float]:
    """Seconds per call of each workload on this process's emulated TPU (the --profile-worker side)."""
    from transformers import Qwen3ForCausalLM

    out = {}
    for hidden, layers, batch, seq in ((128, 2, 4, 64), (512, 4, 4, 128)):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(qwen3_config(hidden, layers)).eval().to("tpu")
        ids = torch.randint(0, 1024, (batch, seq)).to("tpu")
        gen = {"max_new_tokens": 32, "do_sample": False, "min_new_tokens": 32}
        with torch.no_grad():
            fwd, generate = interleaved_medians(
                [lambda: model(ids).logits.cpu(), lambda: model.generate(ids[:, :16], **gen)], repeats
            )
        out[f"forward  hidden={hidden} layers={layers} batch={batch}x{seq}"] = fwd
        out[f"generate hidden={hidden} layers={layers} 32 tokens"] = generate
    return out


def bench_profiles(repeats: int, rounds: int = 3) -> None:
    """The faithful profile (TPU numerics and the gap workarounds) against ideal (CPU-exact)."""
    times: dict[str, dict[str, list[float]]] = {"torch_tpu": {}, "ideal": {}}
    for _ in range(rounds):
        for profile in ("ideal", "torch_tpu"):
            env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATOR_HOST"}
            env |= {"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_PROFILE": profile}
            cmd = [sys.executable, __file__, "--profile-worker", "--repeats", str(max(1, repeats // 3))]
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=1800)
            for label, seconds in json.loads(result.stdout.strip().splitlines()[-1]).items():
                times[profile].setdefault(label, []).append(seconds)
    print("\nprofile torch_tpu (TPU numerics + gap workarounds) vs ideal (CPU-exact), emulated TPU:")
    for label, ideal in times["ideal"].items():
        t_ideal, t_tpu = statistics.median(ideal), statistics.median(times["torch_tpu"][label])
        print(
            f"{label:<48} ideal {t_ideal * 1e3:8.1f} ms   torch_tpu {t_tpu * 1e3:8.1f} ms   cost {t_tpu / t_ideal:.2f}x"
        )


TINY_OP_GOAL = 1.2  # issue 17: a lone small op at most 1.2x its CPU time


def bench_tiny_ops(n: int = 2000) -> None:
    """The small ops a decode step is made of, on one token's hidden state (1x1x256 fp32): the emulator's
    per-op dispatch cost, since the same CPU kernel runs underneath."""

    def ops(device: str) -> dict[str, Callable[[], object]]:
        a, b = torch.randn(1, 1, 256, device=device), torch.randn(1, 1, 256, device=device)
        return {
            "a + b": lambda: a + b,
            "a * b": lambda: a * b,
            "a * 0.5": lambda: a * 0.5,
            "rsqrt": lambda: torch.rsqrt(a),
            "pow(2).mean(-1)": lambda: a.pow(2).mean(-1, keepdim=True),
            "silu": lambda: torch.nn.functional.silu(a),
            "cat": lambda: torch.cat([a, b], -1),
            "a.add_(b)": lambda: a.add_(b, alpha=0.0),
        }

    cpu, tpu = ops("cpu"), ops("tpu")
    for name in cpu:
        t_cpu, t_tpu = (
            t / n
            for t in interleaved_medians(
                [lambda f=cpu[name]: [f() for _ in range(n)], lambda f=tpu[name]: [f() for _ in range(n)]], 7
            )
        )
        print(
            f"{'tiny op: ' + name:<48} cpu {t_cpu * 1e6:8.2f} us   tpu(emulated) {t_tpu * 1e6:8.2f} us   "
            f"ratio {t_tpu / t_cpu:.2f}x{'' if t_tpu / t_cpu <= TINY_OP_GOAL else f' (goal <= {TINY_OP_GOAL}x: not met)'}"
        )


def bench_build() -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = os.environ | {"HF_TPU_CACHE": cache, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
        code = "import time, hf_tpu.emulator as e; t=time.perf_counter(); e.build(); print(time.perf_counter()-t)"
        cold = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=1800
        )
        warm = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=600
        )
    print(
        f"core build: cold {float(cold.stdout.split()[-1]):.1f} s, cached load {float(warm.stdout.split()[-1]) * 1e3:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-build", action="store_true", help="do not measure the cold build of the core")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--profile-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import hf_tpu.emulator

    if args.profile_worker:
        torch.set_num_threads(os.cpu_count() or 1)
        print(json.dumps(_profile_workloads(args.repeats)))
        return
    hf_tpu.emulator.enable()
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    bench_model(args.repeats)
    bench_tiny_ops()
    bench_profiles(args.repeats)
    base = _import_time({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    off = _import_time({})
    on = _import_time({"HF_TPU_EMULATE": "1"})
    print(
        f"\nimport torch: {base * 1e3:.0f} ms without autoload; autoload adds {(off - base) * 1e3:+.1f} ms with "
        f"emulation off, {(on - base) * 1e3:+.0f} ms with HF_TPU_EMULATE=1 (core cached)"
    )
    if not args.skip_build:
        bench_build()


if __name__ == "__main__":
    main()
