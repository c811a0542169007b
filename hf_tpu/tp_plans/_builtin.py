"""The plans hf_tpu ships for models whose library ships none (gap models_without_a_tp_plan).

Chosen by use on TPU: SD3's transformer (the diffusers model TPU users run that has no ``_tp_plan``), T5
(SD3's and Flux's 4.7B text encoder, the one too large for a small chip), Qwen3-VL (popular VLM whose
config has no ``base_model_tp_plan``), OPT (classic dense family) and gpt-oss's dense parts (its config
ships an expert-parallel plan only). GPT-2, Falcon and Bloom are left out: their fused QKV layouts
(``Conv1D`` stored transposed, per-head interleaving, ALiBi per head) need styles neither library has.
"""

from __future__ import annotations

from hf_tpu.tp_plans._core import IfPresent, TPPlan, register

_LLAMA_LIKE_ATTN = {
    "layers.*.self_attn.q_proj": "colwise",
    "layers.*.self_attn.k_proj": "colwise",
    "layers.*.self_attn.v_proj": "colwise",
    "layers.*.self_attn.o_proj": "rowwise",
}
_GATED_MLP = {
    "layers.*.mlp.gate_proj": "colwise",
    "layers.*.mlp.up_proj": "colwise",
    "layers.*.mlp.down_proj": "rowwise",
}

QWEN3_VL_TEXT = TPPlan(
    plan={"embed_tokens": "embedding_rowwise", **_LLAMA_LIKE_ATTN, **_GATED_MLP},
    replicated=("layers.*.self_attn.q_norm", "layers.*.self_attn.k_norm", "norm"),
    why="Qwen3-VL's text decoder (config ships no base_model_tp_plan); the vision tower stays whole",
)

GPT_OSS = TPPlan(
    plan={
        "embed_tokens": "embedding_rowwise",
        **_LLAMA_LIKE_ATTN,
        # one sink logit per head: shard it with the heads, and run attention with the local slice
        "layers.*.self_attn.sinks": "colwise",
        "layers.*.self_attn": "local_params",
    },
    replicated=("layers.*.mlp", "norm"),
    why="gpt-oss dense parts (attention, embeddings); experts stay whole or go expert-parallel with ep_size",
)

OPT_DECODER = TPPlan(
    plan={
        "embed_tokens": "embedding_rowwise",
        "layers.*.self_attn.q_proj": "colwise",
        "layers.*.self_attn.k_proj": "colwise",
        "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.out_proj": "rowwise",
        "layers.*.fc1": "colwise",
        "layers.*.fc2": "rowwise",
    },
    per_rank={"layers.*.self_attn": ("num_heads",)},
    replicated=("embed_positions", "project_in", "project_out", "final_layer_norm"),
    why="OPT decoder; attention reshapes with self.num_heads, which becomes the per-rank count",
)

OPT_LM_HEAD = TPPlan(plan={"lm_head": "colwise_gather_output"}, why="OPT head, tied to the sharded embedding")

_T5_ATTN = {
    f"block.*.layer.*.{attn}.{proj}": style
    for attn in ("SelfAttention", "EncDecAttention")
    for proj, style in (("q", "colwise"), ("k", "colwise"), ("v", "colwise"), ("o", "rowwise"))
}
T5_STACK = TPPlan(
    plan={
        **_T5_ATTN,
        # relative position bias: one column per head, sharded with the heads and looked up locally
        "block.*.layer.*.SelfAttention.relative_attention_bias.weight": "rowwise",
        "block.*.layer.*.SelfAttention.relative_attention_bias": "local_params",
        "block.*.layer.*.DenseReluDense.wi": "colwise",
        "block.*.layer.*.DenseReluDense.wi_0": "colwise",
        "block.*.layer.*.DenseReluDense.wi_1": "colwise",
        "block.*.layer.*.DenseReluDense.wo": "rowwise",
    },
    per_rank={
        "block.*.layer.*.SelfAttention": ("n_heads", "inner_dim"),
        "block.*.layer.*.EncDecAttention": ("n_heads", "inner_dim"),
    },
    replicated=("embed_tokens", "final_layer_norm", "block.*.layer.*.layer_norm"),
    why="T5 encoder/decoder stacks: SD3's and Flux's T5-XXL text encoder, too large for a small chip",
)

SD3_TRANSFORMER = TPPlan(
    plan={
        "transformer_blocks.*.attn.to_q": "colwise",
        "transformer_blocks.*.attn.to_k": "colwise",
        "transformer_blocks.*.attn.to_v": "colwise",
        "transformer_blocks.*.attn.to_out.0": "rowwise",
        "transformer_blocks.*.attn.add_q_proj": "colwise",
        "transformer_blocks.*.attn.add_k_proj": "colwise",
        "transformer_blocks.*.attn.add_v_proj": "colwise",
        # the last block is context_pre_only: no context output projection and no context MLP
        "transformer_blocks.*.attn.to_add_out": IfPresent("rowwise"),
        # SD3.5's dual-attention blocks
        "transformer_blocks.*.attn2.to_q": IfPresent("colwise"),
        "transformer_blocks.*.attn2.to_k": IfPresent("colwise"),
        "transformer_blocks.*.attn2.to_v": IfPresent("colwise"),
        "transformer_blocks.*.attn2.to_out.0": IfPresent("rowwise"),
        "transformer_blocks.*.ff.net.0.proj": "colwise",
        "transformer_blocks.*.ff.net.2": "rowwise",
        "transformer_blocks.*.ff_context.net.0.proj": IfPresent("colwise"),
        "transformer_blocks.*.ff_context.net.2": IfPresent("rowwise"),
    },
    # JointAttnProcessor2_0 computes head_dim = width / attn.heads: with a column shard the width is per-rank,
    # so heads must be too.
    per_rank={"transformer_blocks.*.attn": ("heads",), "transformer_blocks.*.attn2": ("heads",)},
    replicated=(
        "pos_embed",
        "time_text_embed",
        "context_embedder",
        "norm_out",
        "proj_out",
        "transformer_blocks.*.norm",
    ),
    why="SD3/SD3.5 MMDiT (diffusers ships no _tp_plan); AdaLN modulation layers stay whole",
)

BUILTIN = {
    "Qwen3VLTextModel": QWEN3_VL_TEXT,
    "GptOssModel": GPT_OSS,
    "OPTDecoder": OPT_DECODER,
    "OPTForCausalLM": OPT_LM_HEAD,
    "T5Stack": T5_STACK,
    "SD3Transformer2DModel": SD3_TRANSFORMER,
}


def register_builtin() -> None:
    for name, plan in BUILTIN.items():
        register(name, plan, overwrite=True)
