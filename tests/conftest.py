"""Every test runs on the emulated TPU: enable it once for the session.

Tests that need a fresh process (autoload, environment variables read at set-up) start
one with :func:`run_python`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# The suite runs on the default emulated TPU (one v6e chip, faithful profile, workarounds on) whatever the
# user's shell sets: these would change the answers the tests check. Removed before torch is imported,
# since `import torch` sets the device up from them.
for _name in [k for k in os.environ if k.startswith("HF_TPU_EMULATOR_")] + [
    "HF_TPU_WORKAROUNDS",
    "HF_TPU_STRICT_RECOMPILE",
    "HF_TPU_COMPILE_FALLBACK",
    "HF_TPU_GAPS_FILE",
    "HF_TPU_JOIN_TIMEOUT",
    "HF_TPU_RAGGED_DOT_IMPLEMENTATION",
    "TPU_VISIBLE_DEVICES",
    "TPU_VISIBLE_CHIPS",
]:
    os.environ.pop(_name, None)

import hf_tpu.emulator  # noqa: E402

hf_tpu.emulator.enable(quiet=True)
# This process holds its emulated chip once it uses it. Processes the tests start (hf-tpu launch, examples,
# fresh interpreters) each get an emulated host of their own, as if on another TPU VM; on one host they
# could not open the chip (gap device_sharing, tested on purpose in tests/gaps).
os.environ.pop("HF_TPU_EMULATOR_HOST", None)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added to (or, for None values, removed from) ours.

    The child is its own emulated host (as if on another TPU VM): this test process holds its chip,
    and a second process on the same host could not open it (gap device_sharing). Pass
    ``HF_TPU_EMULATOR_HOST`` in ``env`` to share a host on purpose.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for_device_memory(baseline: int, timeout: float = 10.0) -> int:
    """Device bytes above ``baseline`` once transformers' loader threads are done (they may finish a copy or
    two after an error reaches the caller, G4); polls up to ``timeout`` seconds, then returns what is left."""
    import gc
    import time

    import torch

    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        left = torch.accelerator.memory_allocated() - baseline
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.fixture
def float32_matmuls():
    """Exact float32 matmuls and convolutions for the test (TorchTPU's precision "highest", as Hugging
    Face's TPU CI sets it). The default, "medium", rounds their operands to bfloat16, as a chip does."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)


@pytest.fixture
def memory_baseline():
    """Bytes allocated on the chip before the test; the test must return to it."""
    import gc

    gc.collect()
    return torch_memory_allocated()


def torch_memory_allocated() -> int:
    import torch

    return torch.accelerator.memory_allocated()
