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

import hf_tpu.emulator

hf_tpu.emulator.enable(quiet=True)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added to (or, for None values, removed from) ours."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE",)}
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


@pytest.fixture
def memory_baseline():
    """Bytes allocated on the chip before the test; the test must return to it."""
    import gc

    gc.collect()
    return torch_memory_allocated()


def torch_memory_allocated() -> int:
    import torch

    return torch.accelerator.memory_allocated()
