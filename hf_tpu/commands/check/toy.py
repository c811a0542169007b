"""A shrunk random copy of a model, for ``hf-tpu check --run`` and its op survey: the same classes and layout kinds
at toy widths, and a script run on two chips under ``hf-tpu launch``."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

# Toy sizes for the attributes configs use; only those a config already has are changed.
_SHRINK = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16, "vocab_size": 256,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "sliding_window": 8, "d_model": 64, "d_ff": 128, "d_kv": 16,
    "num_heads": 4, "n_group": 1, "topk_group": 1,
}  # fmt: skip


def auto_class(config: Any) -> Any:
    """The Auto class that builds ``config``'s model with its LM head (seq2seq or causal)."""
    import transformers

    encoder_decoder = getattr(config, "is_encoder_decoder", False)
    return transformers.AutoModelForSeq2SeqLM if encoder_decoder else transformers.AutoModelForCausalLM


def shrink(config: Any) -> Any:
    """A copy of ``config`` at toy widths with 2-3 layers, keeping every layout kind it has."""
    small = copy.deepcopy(config)
    text = small.get_text_config() if hasattr(small, "get_text_config") else small
    for name, value in _SHRINK.items():
        if getattr(text, name, None) is not None:
            setattr(text, name, value)
    if getattr(text, "qk_rope_head_dim", None) is not None and getattr(text, "head_dim", None) is not None:
        text.head_dim = text.qk_rope_head_dim  # MLA configs define head_dim as the RoPE part
    original = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(original, "num_key_value_heads", None) is not None and getattr(original, "num_attention_heads", None):
        mha = original.num_key_value_heads == original.num_attention_heads
        text.num_key_value_heads = text.num_attention_heads if mha else 2  # keep MHA as MHA, GQA as GQA
    layers = 3 if getattr(text, "first_k_dense_replace", None) or getattr(text, "sliding_window", None) else 2
    if getattr(text, "first_k_dense_replace", None):
        text.first_k_dense_replace = 1
    for name in ("num_hidden_layers", "num_layers", "num_decoder_layers"):
        if getattr(text, name, None) is not None:
            setattr(text, name, layers)
    if getattr(text, "layer_types", None):
        kinds = list(dict.fromkeys(text.layer_types))  # every kind once, then the first again
        text.layer_types = (kinds * layers)[:layers]
    if getattr(small, "is_encoder_decoder", False) and getattr(small, "decoder_start_token_id", None) is None:
        small.decoder_start_token_id = small.pad_token_id or 0  # generate() needs one (T5's is its pad token)
    for name in ("mlp_only_layers",):
        if getattr(text, name, None):
            setattr(text, name, [i for i in getattr(text, name) if i < layers])
    return small


def launch_two(script: str, detail: str) -> str:
    """Run ``script`` on 2 chips under ``hf-tpu launch``; ``detail`` when it exits 0, else raise its last line."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TPU_EMULATE", "HF_TPU_EMULATOR_HOST")}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        proc = subprocess.run([sys.executable, "-m", "hf_tpu", "launch", "-n", "2", f.name], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        errors = [
            line.strip() for line in lines if re.match(r"\s*[\w.]*(Error|Exception): ", line)
        ]  # a rank's own error
        raise RuntimeError(errors[0] if errors else (lines or ["TP=2 launch failed"])[-1])
    return detail
