"""Tiny models for the tensor-parallel tests: built from configs, saved, and run once on one chip.

Head counts are 4 (8 for SD3) so TP=2 and TP=4 both divide; ``llama_kv2`` has 2 KV heads on purpose.
"""

from __future__ import annotations

from pathlib import Path

import torch

IDS = [[3, 5, 9, 33, 70, 4], [4, 8, 15, 16, 23, 42]]


def _causal(name: str):
    from transformers import (
        GptOssConfig,
        GptOssForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        OPTConfig,
        OPTForCausalLM,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    if name in ("llama", "llama_kv2"):
        config = LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4 if name == "llama" else 2, tie_word_embeddings=False,
        )  # fmt: skip
        return LlamaForCausalLM(config)
    if name == "big":  # ~12.6 MB of float32 weights: more than an 8 MiB chip, a quarter fits
        config = LlamaConfig(
            vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, tie_word_embeddings=False,
        )  # fmt: skip
        return LlamaForCausalLM(config)
    if name == "opt":
        config = OPTConfig(
            vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
            word_embed_proj_dim=64, max_position_embeddings=64,
        )  # fmt: skip
        return OPTForCausalLM(config)
    if name == "qwen3_vl":
        config = Qwen3VLConfig(
            text_config=dict(
                vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                "mrope_section": [2, 3, 3]},
            ),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               deepstack_visual_indexes=[0]),
            tie_word_embeddings=False,
        )  # fmt: skip
        return Qwen3VLForConditionalGeneration(config)
    if name == "gpt_oss":
        config = GptOssConfig(
            vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip
        return GptOssForCausalLM(config)
    if name == "qwen3_moe":  # 8 experts: 8 / N per chip under expert parallel
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, head_dim=16, num_experts=8, num_experts_per_tok=2,
            tie_word_embeddings=False,
        )  # fmt: skip
        return Qwen3MoeForCausalLM(config)
    raise KeyError(name)


CAUSAL = ("llama", "llama_kv2", "big", "opt", "qwen3_vl", "gpt_oss", "qwen3_moe")


def t5():
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=8,
    )  # fmt: skip
    return T5EncoderModel(config)


def sd3():
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=8,
        joint_attention_dim=32, caption_projection_dim=64, pooled_projection_dim=16, out_channels=4,
        pos_embed_max_size=8, dual_attention_layers=(0,), qk_norm="rms_norm",
    )  # fmt: skip


def flux():
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(2, 2, 4),
    )  # fmt: skip


def sd3_inputs(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, 4, 8, 8, generator=g).to(device),
        "encoder_hidden_states": torch.randn(1, 6, 32, generator=g).to(device),
        "pooled_projections": torch.randn(1, 16, generator=g).to(device),
        "timestep": torch.tensor([500.0]).to(device),
    }


def flux_inputs(device: str) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, 16, 16, generator=g).to(device),
        "encoder_hidden_states": torch.randn(1, 6, 32, generator=g).to(device),
        "pooled_projections": torch.randn(1, 16, generator=g).to(device),
        "timestep": torch.tensor([0.5]).to(device),
        "img_ids": torch.zeros(16, 3).to(device),
        "txt_ids": torch.zeros(6, 3).to(device),
    }


@torch.no_grad()
def reference(name: str, path: Path) -> dict:
    """CPU outputs of the model saved at ``path`` (loaded back with from_pretrained, as the ranks do): the
    independent reference for every TP run (the ranks compute at float32 precision "highest")."""
    if name in CAUSAL:
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        auto = AutoModelForImageTextToText if name == "qwen3_vl" else AutoModelForCausalLM
        model = auto.from_pretrained(path, dtype=torch.float32)
        ids = torch.tensor(IDS, device="cpu")
        out = {"logits": model(ids).logits.cpu()}
        out["tokens"] = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False
        ).cpu()
        if name == "llama":  # bfloat16 on CPU, for the bf16 TP run
            out["logits_bf16"] = auto.from_pretrained(path, dtype=torch.bfloat16)(ids).logits.float()
        return out
    if name == "t5":
        from transformers import T5EncoderModel

        model = T5EncoderModel.from_pretrained(path, dtype=torch.float32)
        return {"hidden": model(torch.tensor(IDS, device="cpu")).last_hidden_state.cpu()}
    if name in ("sd3", "flux"):
        from diffusers import FluxTransformer2DModel, SD3Transformer2DModel

        cls = SD3Transformer2DModel if name == "sd3" else FluxTransformer2DModel
        model = cls.from_pretrained(path)
        inputs = (sd3_inputs if name == "sd3" else flux_inputs)("cpu")
        return {"sample": model(**inputs).sample.cpu()}
    raise KeyError(name)


def build_all(root: Path, names: tuple[str, ...] | None = None) -> Path:
    """Save every tiny model under ``root/<name>`` and its one-chip reference as ``root/<name>.pt``."""
    builders = {n: (lambda n=n: _causal(n)) for n in CAUSAL} | {"t5": t5, "sd3": sd3, "flux": flux}
    for name, build in builders.items():
        if names is not None and name not in names:
            continue
        torch.manual_seed(0)
        model = build()
        with torch.no_grad():  # random init leaves some weights tiny; make every layer matter
            for p in model.parameters():
                if p.ndim >= 1 and p.abs().max() == 0:
                    p.normal_(0, 0.05)
        model.save_pretrained(root / name)
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")  # exact float32 on CPU too
        try:
            torch.save(reference(name, root / name), root / f"{name}.pt")
        finally:
            torch.set_float32_matmul_precision(previous)
    return root
