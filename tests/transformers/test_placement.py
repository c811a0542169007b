"""device_map and max_memory with a "tpu" device (gaps auto_device_map_loads_on_cpu, max_memory_rejects_tpu_keys, device_map_tpu_unknown_at_import)."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from tests.conftest import run_python


@pytest.mark.parametrize("device_map", ["tpu", "tpu:0", {"": "tpu"}, "auto", "balanced", "sequential"])
def test_everything_on_the_chip_when_it_fits(qwen3_dir, device_map):
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map=device_map)
    assert {p.device for p in model.parameters()} == {torch.device("tpu:0")}
    assert {b.device.type for b in model.buffers()} == {"tpu"}


@pytest.mark.usefixtures("float32_matmuls")  # offloading must not change the logits beyond float32 rounding
def test_max_memory_with_tpu_key_offloads_and_says_how_much(qwen3_dir):
    # max_memory_rejects_tpu_keys: upstream rejects "tpu:0" keys. auto_device_map_loads_on_cpu: the split is reported once, with sizes.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            qwen3_dir, device_map="auto", max_memory={"tpu:0": "300KB", "cpu": "1GB"}
        )
    ours = [str(w.message) for w in caught if str(w.message).startswith("hf-tpu: device_map='auto' placed")]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "on tpu:0" in ours[0] and "on cpu" in ours[0] and "max_memory for the chip" in ours[0]
    assert set(model.hf_device_map.values()) == {0, "cpu"}
    cpu = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids.to("tpu")).logits.cpu(), cpu(ids).logits, rtol=1.3e-6, atol=1e-5)


def test_plain_cpu_models_are_untouched(qwen3_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_dir, device_map="cpu")
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_transformers_imported_before_torch_works():
    # device_map_tpu_unknown_at_import: the autoload entry point runs inside `import torch`, which transformers triggers itself.
    code = """
        import tempfile
        import transformers
        import torch
        cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16)
        d = tempfile.mkdtemp()
        transformers.Qwen3ForCausalLM(cfg).save_pretrained(d)
        m = transformers.AutoModelForCausalLM.from_pretrained(d, device_map="tpu")
        print("DEVICE", m.device)
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1"})
    assert "DEVICE tpu:0" in proc.stdout, proc.stderr[-2000:]
