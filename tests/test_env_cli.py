"""``hf-tpu env`` / ``info`` / ``--version`` / ``python -m hf_tpu``: what a bug report needs, as the user's process sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import hf_tpu


def hf_tpu_cli(*args: str, emulate: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    if emulate:
        env["HF_TPU_EMULATE"] = "1"
    return subprocess.run([sys.executable, "-m", "hf_tpu", *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.emulator_only("hf-tpu env on the emulated TPU (tests/xla_cpu checks it on the real wheel)")
def test_env_json_describes_the_emulated_device_versions_and_fixes():
    proc = hf_tpu_cli("env", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["packages"]["torch"] == torch.__version__ and report["packages"]["hf-tpu"] == hf_tpu.__version__
    assert report["device"]["backend"] == "emulated" and report["device"]["accelerator"] == "tpu"
    assert report["device"]["emulator"]["profile"] == "torch_tpu"
    assert report["device"]["hbm_per_chip_bytes"] == 32 << 30  # v6e
    assert report["settings"]["HF_TPU_EMULATE"] == "1"
    assert report["emulator_core_cache"]["state"] == "built, verified"
    states = {f["name"]: f["state"] for f in report["fixes"]}
    assert states["autograd_drained_at_exit"] == "applied" and states["cholesky_on_cpu"] == "applied"


@pytest.mark.emulator_only("hf-tpu env and info on the emulated TPU (tests/xla_cpu checks them on the real wheel)")
def test_env_text_and_info_and_version():
    text = hf_tpu_cli("env")
    assert text.returncode == 0 and "emulator profile: torch_tpu" in text.stdout and "fixes (patches" in text.stdout
    info = hf_tpu_cli("info")
    assert info.stdout.strip() == f"hf-tpu {hf_tpu.__version__}: backend emulated", info.stdout
    assert hf_tpu_cli("info", emulate=False).stdout.strip() == f"hf-tpu {hf_tpu.__version__}: backend none"
    assert hf_tpu_cli("--version").stdout.strip() == f"hf-tpu {hf_tpu.__version__}"


def test_transformers_env_names_the_tpu():
    """transformers_env_omits_the_tpu: `transformers env` printed the accelerator as "NA" on a TPU and no device row."""
    from transformers.cli.system import env

    info = env()  # this process runs on the emulated TPU (tests/conftest.py)
    assert info["PyTorch version (accelerator?)"].endswith("(TPU)"), info
    assert info["TPU type"].startswith(torch.tpu.get_device_name()) and "1 chip(s)" in info["TPU type"]
    assert info["hf-tpu version"].startswith(hf_tpu.__version__)
