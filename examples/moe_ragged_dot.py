"""The blog's snippet: MoE decoding with the ragged-dot-tpu kernel as transformers' experts implementation.

    python examples/moe_ragged_dot.py [MODEL_ID_OR_DIR] [--prompt TEXT]

On a TPU VM this runs on the chip through TorchTPU (tokamax picks the Pallas kernel). Anywhere else it switches
the emulated TPU on and, without a model argument, builds a small Qwen3-MoE and a tokenizer locally. Without the
Hub (or with a tokamax too old for the Hub build) hf-tpu serves its shipped copy of the same kernel; and with
hf-tpu the two registration lines are optional: "tokamax_ragged_dot" is registered already.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def small_local_moe() -> str:
    """A 2-layer Qwen3-MoE (16 experts, top-4) with random weights and a character-level tokenizer, in a temp dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3MoeConfig, Qwen3MoeForCausalLM

    path = tempfile.mkdtemp(prefix="hf-tpu-moe-")
    vocab = {chr(i): i for i in range(256)} | {"<pad>": 256, "<eos>": 257}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    config = Qwen3MoeConfig(
        vocab_size=258,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=4,
        pad_token_id=256,
        eos_token_id=257,
    )
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(config).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="Hub id or local directory (default: a small local MoE)")
    parser.add_argument("--prompt", default="TPUs are")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    on_tpu = torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "tpu"
    if not on_tpu:
        import hf_tpu.emulator

        hf_tpu.emulator.enable()
    model_id = args.model or small_local_moe()

    # --- the blog's snippet ---------------------------------------------------------------
    from kernels import get_kernel
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    repo_id = "tengomucho/ragged-dot-tpu"
    kernel = get_kernel(repo_id, version=1, trust_remote_code=[repo_id])
    ALL_EXPERTS_FUNCTIONS.register("tokamax_ragged_dot", kernel.experts_forward)

    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForCausalLM.from_pretrained(
        model_id, device_map="tpu", experts_implementation="tokamax_ragged_dot"
    )
    inputs = tokenizer(args.prompt, return_tensors="pt").to("tpu")
    outputs = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    print(tokenizer.decode(outputs[0], skip_special_tokens=True))
    # ---------------------------------------------------------------------------------------

    new = outputs.shape[1] - inputs["input_ids"].shape[1]
    print(
        f"\n{new} new tokens on {model.device} with experts_implementation={model.get_experts_implementation()['']!r}"
    )


if __name__ == "__main__":
    main()
