"""Autoload through the torch.backends entry point: opt-in, announced, never crashing import torch."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_python

pytestmark = pytest.mark.emulator_only("the emulator's own start-up: HF_TPU_EMULATE, its announcement, its autoload")

PROBE = """
    import torch
    print("TPU", hasattr(torch, "tpu"), torch._C._get_privateuse1_backend_name())
"""


def test_off_by_default():
    proc = run_python(PROBE)
    assert proc.returncode == 0, proc.stderr
    assert "TPU False privateuseone" in proc.stdout
    assert "hf-tpu" not in proc.stderr


def test_env_var_turns_it_on_with_one_line():
    proc = run_python(PROBE + "    print(torch.ones(2, device='tpu').device)\n", env={"HF_TPU_EMULATE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "TPU True tpu" in proc.stdout and "tpu:0" in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hf-tpu:")]
    assert lines == [
        "hf-tpu: emulated TPU v6e (CPU-backed), 1 chip, 32 GiB HBM, profile torch_tpu (TPU numerics, 16 known "
        "TorchTPU gaps)"
    ]


def test_generation_choice():
    proc = run_python(PROBE, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_GENERATION": "v5e"})
    assert "hf-tpu: emulated TPU v5e (CPU-backed), 1 chip, 16 GiB HBM" in proc.stderr


def test_torch_autoload_switch_is_honoured():
    proc = run_python(PROBE, env={"HF_TPU_EMULATE": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert "TPU False privateuseone" in proc.stdout
    assert "hf-tpu" not in proc.stderr


def test_explicit_enable_without_env():
    code = """
        import torch, hf_tpu.emulator
        assert hf_tpu.emulator.enable(quiet=True)
        assert hf_tpu.emulator.enable()  # idempotent
        import hf_tpu
        print(hf_tpu.backend(), torch.ones(1).to("tpu").device)
    """
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert "emulated tpu:0" in proc.stdout


def test_privateuse1_taken_by_another_backend_is_a_clear_error():
    code = """
        import os, warnings
        import torch
        torch.utils.rename_privateuse1_backend("npu")
        from hf_tpu import _autoload
        os.environ["HF_TPU_EMULATE"] = "1"
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _autoload.autoload()  # the entry point warns, never raises
        print("WARN", [str(x.message) for x in w])
        import hf_tpu.emulator
        try:
            hf_tpu.emulator.enable()
        except RuntimeError as err:
            print("ERR", err)
    """
    proc = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "already registered as 'npu'" in proc.stdout
    assert proc.stdout.count("already registered as 'npu'") == 2


def test_real_tpu_wins(tmp_path):
    # A stand-in torch_tpu that claims the device as TorchTPU does when a chip is present.
    pkg = tmp_path / "torch_tpu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
            import torch
            torch.utils.rename_privateuse1_backend("tpu")
        """)
    )
    code = """
        import os, warnings, torch, torch_tpu
        from hf_tpu import _autoload
        import hf_tpu.emulator
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            _autoload.autoload()
        print("WARN", [str(x.message) for x in w])
        print("ENABLED", hf_tpu.emulator.is_enabled(), hasattr(torch, "tpu"))
    """
    proc = run_python(
        code,
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_TPU_EMULATE": "1", "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "real TPU is present; using the real TPU" in proc.stdout
    assert "ENABLED False False" in proc.stdout
