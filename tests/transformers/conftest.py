"""Tiny models built from configs, saved once per session and loaded back with from_pretrained."""

from __future__ import annotations

import pytest
import torch
import transformers


def qwen3_config(**overrides):
    base = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    return transformers.Qwen3Config(**(base | overrides))


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("qwen3")
    transformers.Qwen3ForCausalLM(qwen3_config()).save_pretrained(path)
    return path
