"""PyTorch's OpInfo database on the emulated TPU vs CPU, with a checked-in list of known failures."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.emulator.opinfo_sweep import sweep

EXPECTED = Path(__file__).with_name("opinfo_expected_failures.txt")


def load_expected() -> dict[str, str]:
    """``key  # reason`` per line; blank lines and ``#`` comments are ignored."""
    expected = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition("#")
        assert reason.strip(), f"{EXPECTED.name}: {key.strip()} needs a reason"
        expected[key.strip()] = reason.strip()
    return expected


@pytest.mark.timeout(1500)
def test_opinfo_sweep_matches_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = sweep()
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results)
    rate = passed / (passed + failed)
    print(f"\nOpInfo sweep on the emulated TPU: {passed} passed, {failed} failed samples ({100 * rate:.2f} %)")
    expected = load_expected()
    failing = {r.key: r for r in results if r.failed}
    new = {k: r.first_error for k, r in failing.items() if k not in expected}
    fixed = sorted(k for k in expected if k not in failing)
    assert not new, "new failures (fix them or list them with a reason):\n" + "\n".join(
        f"{k}  # {e}" for k, e in sorted(new.items())
    )
    assert not fixed, "listed as failing but now passing (remove from the list):\n" + "\n".join(fixed)
    assert rate >= 0.95
