"""The host-level gaps (several chips, several processes) and the emulated host they need, each in fresh
processes: a plain process on an 8-chip host, a process pinned with TPU_VISIBLE_DEVICES, a second process."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.conftest import run_python

pytestmark = pytest.mark.emulator_only(
    "an emulated multi-chip host: its chips, torchrun ranks, TPU_VISIBLE_DEVICES and chip sharing"
)

EIGHT_CHIPS = {"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_SLICE": "v6e-8"}


def run_json(code: str, env: dict[str, str]) -> dict:
    proc = run_python("import json, torch\n" + textwrap.dedent(code), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_plain_process_sees_every_chip_of_its_host():
    out = run_json(
        """
        t = torch.ones(1024, device="tpu:5")
        u = t.to("tpu:2") * 2  # copy between chips, then compute on chip 2
        try:
            t + torch.ones(1024, device="tpu:1")
            mixed = ""
        except RuntimeError as err:
            mixed = str(err)
        try:
            torch.accelerator.set_device_index(3)
            switch = ""
        except ValueError as err:
            switch = str(err)
        with torch.accelerator.device_index(4):
            inside = torch.empty(1, device="tpu").device.index
        print(json.dumps({
            "count": torch.accelerator.device_count(),
            "current": torch.accelerator.current_device_index(),
            "devices": [t.device.index, u.device.index, inside],
            "bytes": [torch.accelerator.memory_allocated(i) for i in range(8)],
            "value": u.sum().item(),
            "mixed": mixed, "switch": switch,
            "generators": len(torch.tpu.default_generators),
            "name": torch.tpu.get_device_name(),
        }))
        """,
        EIGHT_CHIPS,
    )
    assert out["count"] == 8 and out["current"] == 0 and out["generators"] == 8
    assert out["devices"] == [5, 2, 4] and out["value"] == 2048.0
    assert out["bytes"][5] == 4096 and out["bytes"][2] == 4096 and out["bytes"][0] == 0
    assert "tpu:1" in out["mixed"] and "same device" in out["mixed"]
    assert "bound to device index 0" in out["switch"]


def test_device_index_gap_and_its_workaround():
    code = """
        moved = torch.zeros(2).to(7)
        module = torch.nn.Linear(2, 2).to(3)
        print(json.dumps([moved.device.index, module.weight.device.index, torch.zeros(1).to("tpu:6").device.index]))
        """
    assert run_json(code, {**EIGHT_CHIPS, "HF_TPU_WORKAROUNDS": "0"}) == [0, 0, 6]  # TorchTPU: an int means chip 0
    assert run_json(code, EIGHT_CHIPS) == [7, 3, 6]


def test_visible_devices_gap_warns_and_only_visible_chips_hold_tensors():
    proc = run_python(
        """
        import torch
        print(torch.accelerator.device_count())
        torch.ones(1, device="tpu:1")
        torch.ones(1, device="tpu:2")
        """,
        env={**EIGHT_CHIPS, "TPU_VISIBLE_DEVICES": "3,4"},
    )
    assert proc.returncode == 1
    assert proc.stdout.split()[0] == "8"  # the gap: the host's count, not the visible one
    assert "gap 'visible_devices'" in proc.stderr and "TPU_VISIBLE_DEVICES=3,4" in proc.stderr
    assert "tpu:2 is not visible to this process" in proc.stderr


def test_a_torchrun_rank_sees_its_own_chip_as_tpu_0():
    out = run_json(
        """
        t = torch.ones(4, device="tpu")
        print(json.dumps([torch.accelerator.device_count(), t.device.index]))
        """,
        {**EIGHT_CHIPS, "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"},
    )
    assert out == [1, 0]


@pytest.mark.long
def test_device_sharing_a_second_process_cannot_open_a_held_chip():
    holder = textwrap.dedent(
        """
        import os, subprocess, sys, torch
        torch.ones(2, device="tpu").sum().item()  # hold chip 0
        child = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True, timeout=300)
        print("CHILD", child.returncode, child.stderr.strip().splitlines()[-1] if child.stderr.strip() else "")
        """
    )
    child = "import torch; torch.ones(2, device='tpu').sum().item()"
    for mode, code in (("raise", 1), ("abort", -6)):
        proc = run_python(
            f"import sys; sys.argv = ['holder', {child!r}]\n" + holder,
            env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_GAPS": mode},
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = next(line for line in proc.stdout.splitlines() if line.startswith("CHILD"))
        assert line.startswith(f"CHILD {code} "), line
        if mode == "raise":
            assert "device_sharing" in line and "holds it" in line
    # A process that never uses the device holds nothing (the launcher of `hf-tpu launch`, for one).
    idle = run_python(
        f"import sys; sys.argv = ['holder', {child!r}]\n"
        + holder.replace('torch.ones(2, device="tpu").sum().item()', ""),
        env={"HF_TPU_EMULATE": "1"},
    )
    assert "CHILD 0 " in idle.stdout, idle.stdout + idle.stderr[-2000:]


@pytest.mark.long
def test_bad_host_settings_are_clear_errors():
    for env, message in (
        ({"HF_TPU_EMULATOR_SLICE": "v6e-16"}, "spans 2 hosts"),
        ({"HF_TPU_EMULATOR_SLICE": "tpu-8"}, "not a slice name"),
        ({"HF_TPU_EMULATOR_CHIPS": "zero"}, "HF_TPU_EMULATOR_CHIPS='zero' must be a whole number"),
        ({"HF_TPU_EMULATOR_PROFILE": "fast"}, "HF_TPU_EMULATOR_PROFILE='fast' is not a profile"),
        ({"HF_TPU_EMULATOR_GAPS": "maybe"}, "HF_TPU_EMULATOR_GAPS='maybe'"),
        ({"HF_TPU_EMULATOR_CHIPS": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, "rank 3 has no chip"),
    ):
        proc = run_python("import hf_tpu.emulator as e; e.enable()", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **env})
        assert proc.returncode == 1 and message in proc.stderr, (env, proc.stderr[-1500:])
