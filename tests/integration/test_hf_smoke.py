"""A tiny Qwen3 saved to disk, loaded with device_map="tpu", generates CPU's greedy tokens."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    config = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(path)
    return path


def test_from_pretrained_device_map_tpu_generates_cpu_tokens(tiny_qwen3):
    cpu = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3, device_map="tpu")
    assert tpu.device == torch.device("tpu:0")
    assert all(p.device.type == "tpu" for p in tpu.parameters())
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    expected = cpu.generate(ids, max_new_tokens=12, do_sample=False)
    actual = tpu.generate(ids.to("tpu"), max_new_tokens=12, do_sample=False)
    assert actual.device.type == "tpu"
    assert actual.cpu().tolist() == expected.tolist()
    with torch.no_grad():
        # Same CPU kernels underneath: logits agree exactly (tolerance 0).
        torch.testing.assert_close(tpu(ids.to("tpu")).logits.cpu(), cpu(ids).logits, rtol=0, atol=0)


def test_save_pretrained_from_device_matches_cpu(tiny_qwen3, tmp_path):
    cpu = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    tpu = transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3, device_map="tpu")
    cpu.save_pretrained(tmp_path / "cpu")
    tpu.save_pretrained(tmp_path / "tpu")
    a = (tmp_path / "cpu" / "model.safetensors").read_bytes()
    b = (tmp_path / "tpu" / "model.safetensors").read_bytes()
    assert a == b
