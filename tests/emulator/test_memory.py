"""HBM accounting through torch.accelerator, the capacity limit and the OOM error."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import run_python

pytestmark = pytest.mark.emulator_only(
    "the emulator's model of a chip's HBM: capacity, out-of-memory errors, allocator statistics (XLA:CPU keeps none)"
)

MiB = 1 << 20


def test_allocation_counts_and_returns_to_baseline(memory_baseline):
    x = torch.empty(MiB, dtype=torch.uint8, device="tpu")
    assert torch.accelerator.memory_allocated() == memory_baseline + MiB
    y = x.float()  # a fresh output of the fallback is counted too
    assert torch.accelerator.memory_allocated() == memory_baseline + 5 * MiB
    v = x[10:]  # views allocate nothing
    assert torch.accelerator.memory_allocated() == memory_baseline + 5 * MiB
    del x, y, v
    gc.collect()
    assert torch.accelerator.memory_allocated() == memory_baseline


def test_peak_and_stats(memory_baseline):
    torch.accelerator.reset_peak_memory_stats()
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="tpu")
    del x
    assert torch.accelerator.max_memory_allocated() >= memory_baseline + 2 * MiB
    stats = torch.accelerator.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "active_bytes.all.current",
        "active_bytes.all.peak",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
    ):
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == memory_baseline
    assert torch.accelerator.memory_reserved() == memory_baseline
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == memory_baseline
    torch.accelerator.empty_cache()
    free, total = torch.accelerator.get_memory_info()
    assert total == 32 * (1 << 30) and free == total - memory_baseline


def test_reset_accumulated_stats_not_implemented_like_torchtpu():
    with pytest.raises(NotImplementedError, match="not implemented for TPU"):
        torch.accelerator.reset_accumulated_memory_stats()


def test_oom_names_chip_request_usage_and_fix():
    code = """
        import gc, torch
        a = torch.empty(40 << 20, dtype=torch.uint8, device="tpu")
        base = torch.accelerator.memory_allocated()
        try:
            torch.empty(30 << 20, dtype=torch.uint8, device="tpu")
        except torch.OutOfMemoryError as err:
            print("MSG", err)
        # fresh outputs of the fallback hit the same limit
        try:
            a.float()
        except torch.OutOfMemoryError as err:
            print("MSG2", str(err).splitlines()[0])
        assert torch.accelerator.memory_allocated() == base, torch.accelerator.memory_allocated()
        del a; gc.collect()
        assert torch.accelerator.memory_allocated() == 0
        b = torch.ones(50 << 20, dtype=torch.uint8, device="tpu")  # the device is still usable
        print("SUM", int(b.sum()))
        print("STATS", torch.accelerator.memory_stats()["num_ooms"])
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_HBM": "64MiB"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "TPU out of memory on tpu:0" in out
    assert "tried to allocate 30.00 MiB" in out
    assert "40.00 MiB already in use" in out and "64.00 MiB HBM" in out
    assert "HF_TPU_EMULATOR_HBM" in out
    assert "MSG2 TPU out of memory" in out
    assert f"SUM {50 << 20}" in out
    assert "STATS 2" in out
    assert "64 MiB HBM" in proc.stderr  # the announcement states the capacity


def test_bad_capacity_setting_is_explained():
    proc = run_python("import hf_tpu.emulator as e; e.enable(hbm='lots')", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode != 0
    assert "HF_TPU_EMULATOR_HBM='lots' is not a size" in proc.stderr


def test_op_outputs_are_device_memory(memory_baseline):
    """An op's fresh output (its CPU kernel's buffer, taken over as device memory) is counted while it lives,
    can be resized and written like any device tensor, and is returned when it dies."""
    a = torch.ones(MiB // 4, device="tpu")
    b = a + a
    assert torch.accelerator.memory_allocated() == memory_baseline + 2 * MiB
    assert b.untyped_storage().device == torch.device("tpu:0") and b.data_ptr() != a.data_ptr()
    b.resize_(MiB // 2)  # grows through the device allocator
    assert torch.accelerator.memory_allocated() == memory_baseline + 3 * MiB
    b[MiB // 4 :] = 3.0
    assert b[: MiB // 4].cpu().eq(2.0).all() and b[MiB // 4 :].cpu().eq(3.0).all()
    c = torch.cat([a, a]).sum()  # a temporary and a reduction: only the 0-dim result stays
    assert c.item() == MiB // 2
    del a, b
    gc.collect()
    assert 0 < torch.accelerator.memory_allocated() - memory_baseline < MiB  # c's 0-dim result (a chip rounds it up)
    del c
    assert torch.accelerator.memory_allocated() == memory_baseline
