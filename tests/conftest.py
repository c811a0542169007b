"""Every test runs on the emulated TPU (enabled once for the session), or, with ``HF_TPU_XLA_CPU=1`` (``make
xla-cpu``), on the real torch-tpu wheel running its programs on XLA:CPU.

On the real wheel, a test marked ``emulator_only`` is skipped with its reason (it needs what only the emulator
has), and a test listed in ``tests/xla_cpu_expected_failures.txt`` must fail (a TorchTPU gap or an XLA:CPU limit,
each entry with its cause): strict, so one that starts passing fails the run too.

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
# Compile counts are checked from a cold cache: no persistent compile cache in the tests' processes (and their
# children) but where a test turns it on to test it (tests/test_compile_cache.py).
os.environ["HF_TPU_COMPILE_CACHE"] = "0"

from hf_tpu import settings  # noqa: E402

XLA_CPU = settings.get("HF_TPU_XLA_CPU")  # the real wheel on XLA:CPU; else the emulator
# A chip's numerics (float32 matmuls rounded to bfloat16 at the default precision, bfloat16 attention): the emulator
# reproduces them; XLA:CPU computes float32 exactly. Tests that prove the rounding happens check it only here.
TPU_NUMERICS = not XLA_CPU
if XLA_CPU:
    import torch  # noqa: E402, F401  (TorchTPU's device is set up by the autoload, on XLA:CPU)

    import hf_tpu  # noqa: E402

    if hf_tpu.backend() != "xla_cpu":
        raise RuntimeError(f"HF_TPU_XLA_CPU=1 but the tests would run on {hf_tpu.backend()!r} (see the warning above)")
else:
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
    ``HF_TPU_EMULATOR_HOST`` in ``env`` to share a host on purpose. ``HF_TPU_EMULATE="1"`` means "on the TPU":
    on the real wheel's run (``HF_TPU_XLA_CPU=1``, which the child inherits) it is left out.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    for key, value in (env or {}).items():
        if XLA_CPU and key == "HF_TPU_EMULATE" and value == "1":
            continue  # "on the TPU": on the real wheel's run the child inherits HF_TPU_XLA_CPU=1 instead
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


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child on the same kind of TPU: the emulated one (``HF_TPU_EMULATE=1``, an
    emulated host of its own) or, on the real wheel's run, TorchTPU on XLA:CPU (``HF_TPU_XLA_CPU=1``, inherited)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    if not XLA_CPU:
        env["HF_TPU_EMULATE"] = "1"
    return {**env, **extra}


def wait_for_device_memory(baseline: int, timeout: float = 10.0) -> int:
    """Device bytes above ``baseline`` once transformers' loader threads are done (they may finish a copy or
    two after an error reaches the caller, concurrent_loading_copies); polls up to ``timeout`` seconds, then returns what is left."""
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
    # Dynamo does not guard on the matmul precision: a graph compiled under another one (an earlier test's
    # generate() auto-compiling its static-cache decode step) would be reused with its rounding baked in.
    torch._dynamo.reset()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)
    torch._dynamo.reset()


@pytest.fixture
def memory_baseline():
    """Bytes allocated on the chip before the test; the test must return to it."""
    import gc

    gc.collect()
    return torch_memory_allocated()


def torch_memory_allocated() -> int:
    import torch

    return torch.accelerator.memory_allocated()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "emulator_only(reason): needs what only the emulated TPU has (its core, HBM limits, TPU numerics bands, an "
        "emulated multi-chip host, Pallas/JAX kernels on a chip); skipped on the real wheel on XLA:CPU",
    )


EXPECTED_FAILURES = os.path.join(os.path.dirname(__file__), "xla_cpu_expected_failures.txt")


def expected_failures() -> dict[str, str]:
    """``tests/xla_cpu_expected_failures.txt``: test id -> cause (``gap NAME: ...`` or ``xla_cpu: ...``)."""
    from hf_tpu.gaps import BY_NAME

    table = {}
    with open(EXPECTED_FAILURES) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
            if not line:
                continue
            test, sep, cause = (part.strip() for part in line.partition(" | "))
            kind, _, rest = cause.partition(":")
            gap = kind.removeprefix("gap ").strip() if kind.startswith("gap ") else None
            if not sep or not rest.strip() or (kind != "xla_cpu" and gap not in BY_NAME):
                raise pytest.UsageError(
                    f"{EXPECTED_FAILURES}:{number}: want 'TEST_ID | gap NAME: why' (NAME in hf_tpu.gaps) or "
                    f"'TEST_ID | xla_cpu: why', got {line!r}"
                )
            table[test] = cause
    return table


@pytest.hookimpl(tryfirst=True)  # before -m deselects: every collected test is seen
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not XLA_CPU:
        return
    table = expected_failures()
    collected = {item.nodeid for item in items}
    files = {item.nodeid.split("::")[0] for item in items}
    stale = [test for test in table if test.split("::")[0] in files and test not in collected]
    if stale and not config.getoption("keyword"):
        raise pytest.UsageError(f"{EXPECTED_FAILURES} lists tests that do not exist: {stale}")
    for item in items:
        marker = item.get_closest_marker("emulator_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.skip(reason=f"needs the emulated TPU: {reason}"))
        elif item.nodeid in table:
            item.add_marker(
                pytest.mark.xfail(strict=True, reason=f"on the real wheel on XLA:CPU: {table[item.nodeid]}")
            )
