"""Compiled == eager on the emulated TPU for a tiny Qwen3 forward and a tiny diffusers transformer."""

from __future__ import annotations

import pytest
import torch

import hf_tpu

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")


def test_qwen3_forward_compiled_matches_eager_with_no_recompiles():
    config = transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval().to("tpu")
    ids = torch.randint(0, 256, (2, 24)).to("tpu")
    compiled = torch.compile(model, backend="tpu", fullgraph=True)
    with torch.no_grad(), hf_tpu.watch_compiles() as report:
        eager = model(ids).logits
        for _ in range(3):
            out = compiled(ids).logits
    assert report.count() == 1 and not report.recompiles
    # fp32 with Inductor's fusions: agreement within 1e-4 (observed ~1e-6).
    torch.testing.assert_close(out.cpu(), eager.cpu(), rtol=1e-4, atol=1e-4)


def test_sd3_transformer_compiled_matches_eager():
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=16,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
        pos_embed_max_size=16,
    ).eval()
    inputs = {
        "hidden_states": torch.randn(1, 4, 8, 8),
        "encoder_hidden_states": torch.randn(1, 5, 16),
        "pooled_projections": torch.randn(1, 8),
        "timestep": torch.tensor([10.0]),
    }
    with torch.no_grad():
        cpu = model(**inputs).sample
        model.to("tpu")
        tpu_inputs = {k: v.to("tpu") for k, v in inputs.items()}
        eager = model(**tpu_inputs).sample
        model.compile(backend="tpu", fullgraph=True, dynamic=False)
        compiled = model(**tpu_inputs).sample
    torch.testing.assert_close(eager.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close(compiled.cpu(), eager.cpu(), rtol=1e-4, atol=1e-4)
