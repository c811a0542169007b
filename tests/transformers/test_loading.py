"""Loading respects device memory: no whole-model warm-up (allocator_warmup_takes_the_whole_model), failures leave nothing behind."""

from __future__ import annotations

import gc

import pytest
import torch
import transformers

import hf_tpu.emulator._build as build
from tests.conftest import run_python, wait_for_device_memory


@pytest.mark.emulator_only("the emulator core's allocation log")
def test_no_allocation_larger_than_the_largest_weight(qwen3_dir):
    core = build.load()
    core.take_largest_allocation()
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu")
    largest = core.take_largest_allocation()
    largest_weight = max(p.numel() * p.element_size() for p in model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Upstream's warm-up allocates the whole model in one block (model_bytes) before loading.
    assert largest <= largest_weight < model_bytes


def test_failed_loads_raise_and_return_device_memory(qwen3_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in qwen3_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated file
    gc.collect()
    baseline = torch.accelerator.memory_allocated()
    with pytest.raises(Exception) as caught:
        transformers.AutoModelForCausalLM.from_pretrained(bad, device_map="tpu")
    # safetensors' own error for a file shorter than its header says
    assert type(caught.value).__name__ == "SafetensorError", repr(caught.value)
    assert wait_for_device_memory(baseline) == 0


@pytest.mark.emulator_only("an emulated chip's HBM limit (HF_TPU_EMULATOR_HBM)")
def test_model_larger_than_hbm_fails_with_oom_and_frees_everything(qwen3_dir):
    code = f"""
        import gc, torch, transformers
        gc.collect()
        base = torch.accelerator.memory_allocated()
        try:
            transformers.AutoModelForCausalLM.from_pretrained({str(qwen3_dir)!r}, device_map="tpu")
        except torch.OutOfMemoryError as err:
            print("OOM", str(err).splitlines()[0])
        # transformers' loader threads may still finish a copy or two after the error reaches us (concurrent_loading_copies);
        # those tensors are dropped as they finish: wait for them, up to 10 s.
        import time
        for _ in range(100):
            gc.collect()
            if torch.accelerator.memory_allocated() == base:
                break
            time.sleep(0.1)
        print("LEFT", torch.accelerator.memory_allocated() - base)
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_HBM": "200KB"})
    assert "OOM TPU out of memory on tpu:0" in proc.stdout, proc.stderr[-3000:]
    assert "LEFT 0" in proc.stdout


def test_wrong_dtype_is_a_clear_error_with_nothing_left(qwen3_dir):
    gc.collect()
    baseline = torch.accelerator.memory_allocated()
    try:
        transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="tpu", dtype="float17")
    except (ValueError, TypeError, AttributeError) as err:
        assert "float17" in str(err)
    else:
        raise AssertionError("dtype='float17' was accepted")
    gc.collect()
    assert torch.accelerator.memory_allocated() == baseline
