"""transformers' pipeline() on TPU (patch pipeline_default_device_not_tpu): the chip by default, as CUDA; a model already there stays."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.diffusers.pipelines import byte_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipeline_qwen3")
    config = transformers.Qwen3Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    byte_tokenizer(64).save_pretrained(path)
    return path


def _cases(model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    yield "a model already on tpu", dict(model=transformers.AutoModelForCausalLM.from_pretrained(model_dir).to("tpu"), tokenizer=tokenizer)  # fmt: skip
    yield "a directory, no device", dict(model=str(model_dir))
    yield "device_map='tpu'", dict(model=transformers.AutoModelForCausalLM.from_pretrained(model_dir, device_map="tpu"), tokenizer=tokenizer)  # fmt: skip


@pytest.mark.usefixtures("float32_matmuls")  # greedy text equal to CPU's: float32 matmuls, as on CPU
def test_pipelines_run_on_the_chip_unless_told_otherwise(model_dir):
    expected = transformers.pipeline("text-generation", model=str(model_dir), device="cpu")
    assert expected.device == torch.device("cpu") and expected.model.device.type == "cpu"  # explicit: kept
    want = expected("ab", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    for label, kwargs in _cases(model_dir):
        pipe = transformers.pipeline("text-generation", **kwargs)
        assert pipe.device == torch.device("tpu:0") and pipe.model.device == torch.device("tpu:0"), label
        with torch.no_grad():
            got = pipe("ab", max_new_tokens=4, do_sample=False)[0]["generated_text"]
        assert got == want and len(got) > 2, (label, got, want)
