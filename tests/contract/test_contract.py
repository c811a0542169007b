"""The emulator's ``torch.tpu`` against TorchTPU itself: the real torch-tpu wheel, read without a chip.

``surface.py`` prints each side's public surface (names and signatures of every public module, the ``tpu`` op
schemas, and behaviours that stay off the device runtime); every difference must be listed, with its reason,
in ``intended_differences.txt``. A new difference (a torch-tpu release that changes its surface, or an emulator
change) fails, and so does a listed difference that is gone (the list stays true).

Cost: building the environment once (``environment.py``: a venv with torch, torch-tpu, jax; ~1-2 minutes with a
warm pip cache, ~400 MB downloaded on a cold one), then ~10 s per run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.contract import environment

HERE = Path(__file__).parent
SURFACE = HERE / "surface.py"
INTENDED = HERE / "intended_differences.txt"


def flatten(surface: dict) -> dict[str, str]:
    flat = {}
    for module, names in surface["modules"].items():
        for name, value in names.items():
            flat[f"{module}.{name}"] = value
    flat.update({f"op {name}": schema for name, schema in surface["ops"].items()})
    flat.update({f"behaviour {name}": value for name, value in surface["behaviours"].items()})
    return flat


def read_surface(python: str, env: dict[str, str]) -> dict[str, str]:
    proc = subprocess.run([python, str(SURFACE)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{python} {SURFACE} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return flatten(json.loads(proc.stdout))


def intended() -> dict[str, str]:
    table = {}
    for line in INTENDED.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        key, sep, reason = line.partition("  # ")
        assert sep and reason.strip(), f"{INTENDED.name}: every difference needs a reason: {line!r}"
        table[key.strip()] = reason.strip()
    return table


@pytest.fixture(scope="module")
def real() -> dict[str, str]:
    try:
        path = environment.ensure()
    except environment.ContractEnvironmentError as err:
        if os.environ.get("HF_TPU_CONTRACT_REQUIRED"):
            raise
        pytest.skip(f"torch-tpu {environment.TORCH_TPU} could not be installed here (the contract needs PyPI "
                    f"once; `make test` always runs it): {str(err).splitlines()[0]}")  # fmt: skip
    return read_surface(str(path / "bin" / "python"), environment.env(path))


@pytest.fixture(scope="module")
def emulated() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATOR_HOST",)}
    env["HF_TPU_EMULATE"] = "1"
    return read_surface(sys.executable, env)


def test_emulator_matches_torch_tpu_except_the_listed_differences(real, emulated):
    differences = {k for k in real.keys() | emulated.keys() if real.get(k) != emulated.get(k)}
    listed = intended()
    unlisted = sorted(differences - listed.keys())
    stale = sorted(listed.keys() - differences)
    report = [f"  {k}\n      torch-tpu: {real.get(k, '<absent>')}\n      emulator:  {emulated.get(k, '<absent>')}"
              for k in unlisted]  # fmt: skip
    assert not unlisted, f"{len(unlisted)} difference(s) not in {INTENDED.name}:\n" + "\n".join(report)
    assert not stale, f"listed in {INTENDED.name} but no longer different (remove them): {stale}"


def test_the_real_wheel_was_read(real):
    """Guards the test above against comparing two empty surfaces."""
    assert real["torch.tpu.device_count"].startswith("function")
    assert real["behaviour compile backend 'tpu' registered"] == "True"
    assert sum(k.startswith("torch.tpu.") for k in real) > 60
