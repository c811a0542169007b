"""Six model families, tiny, saved and reloaded with device_map="tpu": logits match CPU's as a chip's would.

At TorchTPU's default matmul precision float32 logits carry bfloat16 rounding (relative error between
1e-4 and 3e-2, the lower bound showing the rounding happened); at "highest" they are float32-close.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.conftest import TPU_NUMERICS

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
# (dtype, matmul precision) -> bounds on the relative error ||tpu - cpu|| / ||cpu|| of the logits.
CASES = {
    "fp32": (torch.float32, "medium", 1e-4, 3e-2),  # bf16 operands, f32 accumulation: bf16 rounding shows
    "fp32-highest": (torch.float32, "highest", 0.0, 1e-5),  # float32 (attention through the math path)
    "bf16": (torch.bfloat16, "medium", 0.0, 3e-2),
}


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


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_cpu(family, case):
    name, path = family
    dtype, precision, low, high = CASES[case]
    model_cls = FAMILIES[name][1]
    cpu = model_cls.from_pretrained(path, dtype=dtype).eval()
    tpu = model_cls.from_pretrained(path, dtype=dtype, device_map="tpu").eval()
    assert {p.device.type for p in tpu.parameters()} == {"tpu"}
    batch = inputs(name)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with torch.no_grad():
            expected = cpu(**batch).logits
            actual = tpu(**{k: v.to("tpu") for k, v in batch.items()}).logits
    finally:
        torch.set_float32_matmul_precision(previous)
    assert actual.device.type == "tpu" and actual.dtype == expected.dtype
    error = ((actual.cpu().double() - expected.double()).norm() / expected.double().norm()).item()
    low = low if TPU_NUMERICS else 0.0  # XLA:CPU computes float32 exactly: only the chip's rounding has a floor
    assert low <= error <= high, f"{name} {case}: relative error {error:.2e} outside [{low}, {high}]"


def test_save_pretrained_from_device_is_identical(family, tmp_path):
    name, path = family
    model_cls = FAMILIES[name][1]
    model_cls.from_pretrained(path).save_pretrained(tmp_path / "cpu")
    model_cls.from_pretrained(path, device_map="tpu").save_pretrained(tmp_path / "tpu")
    for f in sorted((tmp_path / "cpu").glob("*.safetensors")):
        assert f.read_bytes() == (tmp_path / "tpu" / f.name).read_bytes(), f.name
