"""Six model families, tiny, saved and reloaded with device_map="tpu": logits equal CPU's."""

from __future__ import annotations

import pytest
import torch
import transformers

COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
FAMILIES = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(num_key_value_heads=2, head_dim=8)),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(num_key_value_heads=2)),
    "gemma3_text": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        dict(num_key_value_heads=2, head_dim=8, sliding_window=4),
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    ),
    "t5": (
        transformers.T5Config,
        transformers.T5ForConditionalGeneration,
        dict(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0),
    ),
    "bert": (
        transformers.BertConfig,
        transformers.BertForMaskedLM,
        dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
    ),
}
# Same CPU kernels run underneath, so fp32 agrees exactly; bf16 allows one bf16 rounding step of slack.
TOLERANCES = {torch.float32: dict(rtol=0, atol=0), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def build(name: str, path) -> None:
    config_cls, model_cls, extra = FAMILIES[name]
    kwargs = extra if name in ("t5", "bert") else COMMON | extra
    torch.manual_seed(0)
    model_cls(config_cls(**kwargs)).save_pretrained(path)


def inputs(name: str) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 128, (2, 11), generator=torch.Generator().manual_seed(3))
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :5]}
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    build(request.param, path)
    return request.param, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_logits_match_cpu(family, dtype):
    name, path = family
    model_cls = FAMILIES[name][1]
    cpu = model_cls.from_pretrained(path, dtype=dtype).eval()
    tpu = model_cls.from_pretrained(path, dtype=dtype, device_map="tpu").eval()
    assert {p.device.type for p in tpu.parameters()} == {"tpu"}
    batch = inputs(name)
    with torch.no_grad():
        expected = cpu(**batch).logits
        actual = tpu(**{k: v.to("tpu") for k, v in batch.items()}).logits
    assert actual.device.type == "tpu" and actual.dtype == expected.dtype
    torch.testing.assert_close(actual.cpu(), expected, **TOLERANCES[dtype])


def test_save_pretrained_from_device_is_identical(family, tmp_path):
    name, path = family
    model_cls = FAMILIES[name][1]
    model_cls.from_pretrained(path).save_pretrained(tmp_path / "cpu")
    model_cls.from_pretrained(path, device_map="tpu").save_pretrained(tmp_path / "tpu")
    for f in sorted((tmp_path / "cpu").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "tpu" / f.name).read_bytes(), f.name
