"""transformers' own test utilities on the emulated TPU (TRANSFORMERS_TEST_DEVICE=tpu) and memory queries (no_tpu_memory_accounting)."""

from __future__ import annotations

import torch

from tests.conftest import run_python


def test_transformers_testing_utils_pick_the_emulated_tpu():
    code = """
        import torch
        from transformers import testing_utils as tu
        print("DEVICE", tu.torch_device)
        tu.backend_manual_seed(tu.torch_device, 0)
        a = torch.randn(3, device=tu.torch_device)
        tu.backend_manual_seed(tu.torch_device, 0)
        print("SEEDED", torch.equal(a.cpu(), torch.randn(3, device=tu.torch_device).cpu()))
        print("COUNT", tu.backend_device_count(tu.torch_device))
        tu.backend_synchronize(tu.torch_device)
        tu.backend_empty_cache(tu.torch_device)
        print("BF16", tu.is_torch_bf16_available_on_device(tu.torch_device))
        print("FP16", tu.is_torch_fp16_available_on_device(tu.torch_device))
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "TRANSFORMERS_TEST_DEVICE": "tpu"})
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("DEVICE tpu", "SEEDED True", "COUNT 1", "BF16 True", "FP16 True"):
        assert line in out, (line, out, proc.stderr[-2000:])


def test_continuous_batching_sizes_its_cache_from_hbm():
    # no_tpu_memory_accounting: upstream falls back to host RAM numbers on TPU.
    from transformers.generation.continuous_batching import cache, utils

    for fn in (utils.get_device_and_memory_breakdown, cache.get_device_and_memory_breakdown):
        device, total, reserved, allocated = fn()
        assert device.type == "tpu"
        assert total == torch.accelerator.get_memory_info()[1]
        assert allocated == torch.accelerator.memory_allocated()
