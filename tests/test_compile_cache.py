"""Compiled programs outlive the process: a second process running the same code compiles nothing new.

On TorchTPU (a chip, or the real wheel here with ``make xla-cpu``) hf-tpu points the persistent tier-3 cache at
``$HF_TPU_CACHE/torch_tpu/<platform>``; on the emulator, Inductor's caches go to ``$HF_TPU_CACHE/inductor`` and the
emulator compiles its graphs so that Inductor's FX-graph cache serves them (it bypassed them before: "No shape
env"), and saves the keys of its eager executables. ``HF_TPU_COMPILE_CACHE=0``: every process compiles again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hf_tpu.plumbing.cache import cache_root
from tests.conftest import XLA_CPU, child_env

CODE = """
import os
import torch
import hf_tpu

f = torch.compile(lambda x: torch.tanh(x @ x.T) * 3 + 1, backend="tpu", fullgraph=True)
with hf_tpu.count_compilations() as paid:
    y = f(torch.arange(64.0).reshape(8, 8).to("tpu") / 64)
    total = float((y * 2).sum().cpu())
caches = os.environ.get("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT" if hf_tpu.backend() == "xla_cpu" else "TORCHINDUCTOR_CACHE_DIR")
print("PAID", paid.compilations, round(total, 4), caches)
"""


TRAINING_STEP = """
import torch
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
step = torch.compile(model, backend="tpu", fullgraph=True)
loss = step(torch.randn(8, 16).to("tpu")).square().mean()
loss.backward()
grads = sum(float(p.grad.double().sum().cpu()) for p in model.parameters())
aot = counters["aot_autograd"]
print("PAID", aot["autograd_cache_hit"], aot["autograd_cache_miss"], aot["autograd_cache_bypass"], f"{float(loss):.6f}:{grads:.6f}")
"""


def printed_twice(tmp_path: Path, code: str, **env: str) -> list[list[str]]:
    """What ``code`` printed after "PAID" in two fresh processes sharing an ``HF_TPU_CACHE`` that holds no compiled
    program (its built parts linked in: the emulator's core, the PJRT shim)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for part in ("emulator", "xla_cpu"):
        if (cache_root() / part).exists():
            (cache / part).symlink_to(cache_root() / part)
    printed = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=child_env(HF_TPU_CACHE=str(cache), **env),
            capture_output=True,
            text=True,
            timeout=600,
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("PAID")), None)
        assert line is not None, proc.stderr[-3000:]
        printed.append(line.split()[1:])
    return printed


def run_twice(tmp_path: Path, **env: str) -> list[tuple[int, str, str]]:
    """Compilations paid, the result and the cache directory, in each of two processes."""
    return [(int(paid), total, where) for paid, total, where in printed_twice(tmp_path, CODE, **env)]


def test_second_process_compiles_nothing(tmp_path):
    (first, first_total, where), (second, second_total, _) = run_twice(tmp_path, HF_TPU_COMPILE_CACHE="1")
    assert first >= 1 and second == 0, (first, second)
    assert first_total == second_total
    expected = tmp_path / "cache" / ("torch_tpu/xla_cpu" if XLA_CPU else "inductor")
    assert Path(where) == expected and any(expected.rglob("*"))


@pytest.mark.long  # two more cold processes
def test_off_switch_compiles_again_in_every_process(tmp_path):
    (first, _, where), (second, _, _) = run_twice(tmp_path, HF_TPU_COMPILE_CACHE="0")
    assert first >= 1 and second == first
    assert str(tmp_path) not in where  # no cache of hf-tpu's (TorchTPU: none at all; Inductor: its own, unused)


@pytest.mark.emulator_only("AOTAutograd's cache around the emulator's compiled graphs (TorchTPU keeps its own)")
def test_second_process_loads_the_training_graphs_from_aotautograds_cache(tmp_path):
    """Joint tracing and partitioning are most of a warm first compiled step: a second process loads the forward
    and backward graphs from AOTAutograd's cache (the emulator's graphs are kept in its entries), and computes the
    same loss and gradients."""
    first, second = printed_twice(tmp_path, TRAINING_STEP, HF_TPU_COMPILE_CACHE="1")
    (hits, misses, bypasses), loaded = map(int, first[:3]), [int(n) for n in second[:3]]
    assert hits == 0 and misses >= 1 and bypasses == 0, first  # missed, and saved (a bypass saves nothing)
    assert loaded[0] >= 1 and loaded[1:] == [0, 0], second  # every graph loaded
    assert first[3] == second[3]  # the same loss and gradients
