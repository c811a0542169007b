"""Tiny MoE models built from configs, saved once per session and loaded back with from_pretrained."""

from __future__ import annotations

import pytest
import torch
import transformers


def qwen3_moe_config(**overrides):
    base = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=256,
    )
    return transformers.Qwen3MoeConfig(**(base | overrides))


def gpt_oss_config(**overrides):
    base = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
        max_position_embeddings=256,
    )
    return transformers.GptOssConfig(**(base | overrides))


@pytest.fixture(scope="session")
def qwen3_moe_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3_moe")
    transformers.Qwen3MoeForCausalLM(qwen3_moe_config()).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def gpt_oss_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt_oss")
    model = transformers.GptOssForCausalLM(gpt_oss_config())
    with torch.no_grad():  # biases start at zero: make them matter
        for name, param in model.named_parameters():
            if name.endswith("_bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path
