"""``hf-tpu gaps`` on the real wheel (XLA:CPU) against the emulator's ``torch_tpu`` profile, gap by gap.

The emulator's profile reproduces the gaps of TorchTPU :data:`RELEASE` (the table's ``fixed_in``), which
tests/gaps/test_cli.py checks on the emulator. Here the real wheel answers the same probes: every gap XLA:CPU can
show must be present exactly when the profile reproduces it, and closed by hf-tpu's workaround where there is one.
A disagreement fails unless the table explains it: ``hidden_on_xla_cpu`` (a Pallas kernel, one CPU client),
``needs_chips`` (XLA:CPU gives TorchTPU one device), ``intermittent`` (a race), or ``emulated=False`` (the emulator
does something else, named in its ``emulator`` field).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest

from hf_tpu.emulator.gaps import RELEASE, fixed_in_release
from hf_tpu.gaps import GAPS, get
from tests.conftest import XLA_CPU

pytestmark = pytest.mark.skipif(not XLA_CPU, reason="runs in `make xla-cpu` (the real wheel's own environment)")


def emulator_profile_answer(name: str) -> str:
    """What ``hf-tpu gaps`` answers for ``name`` on the emulator's torch_tpu profile."""
    gap = get(name)
    return "fixed" if name in fixed_in_release() or not gap.emulated else "present"


def unexplained(result: dict) -> str | None:
    """Why the real wheel's answer for one gap disagrees with the emulator's, or None when they agree (or the
    table explains the difference)."""
    gap, real = get(result["name"]), result["without_workarounds"]
    if gap.hidden_on_xla_cpu or real == "n/a" and gap.needs_chips > 1:
        return None
    if not gap.emulated:
        return None if real == "present" else f"{gap.name}: the real wheel says {real}; the table lists it present"
    expected = emulator_profile_answer(gap.name)
    if real == expected or gap.intermittent and (real, expected) == ("not seen", "present"):
        return None
    return f"{gap.name}: the real wheel says {real}, the emulator's torch_tpu profile {expected} ({result['detail']})"


def test_the_real_wheel_has_the_gaps_the_emulator_reproduces():
    assert version("torch-tpu") == RELEASE, "the emulator's profile names another release than this wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "hf_tpu", "gaps", "--json", "--no-save"],
        env={k: v for k, v in os.environ.items() if k != "HF_TPU_WORKAROUNDS"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    lines = proc.stdout.splitlines()  # TorchTPU's start-up prints, then the JSON list
    results = json.loads("\n".join(lines[lines.index("[") :]))
    assert [r["name"] for r in results] == [gap.name for gap in GAPS]
    assert not [r["name"] for r in results if r["without_workarounds"] == "timeout"]
    assert [why for r in results if (why := unexplained(r))] == []
    # hf-tpu closes every gap present on the real wheel that it has a workaround for
    worked_around = [r for r in results if r["without_workarounds"] == "present" and r["workaround"]]
    assert [r["name"] for r in worked_around if r["with_workarounds"] != "fixed"] == []
