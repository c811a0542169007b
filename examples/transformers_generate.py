"""The blog's snippet: load a causal LM on the TPU and generate 64 tokens.

    python examples/transformers_generate.py [MODEL_ID_OR_DIR] [--prompt TEXT]

On a TPU VM this runs on the chip through TorchTPU. Anywhere else it switches the emulated
TPU on and, without a model argument, builds a small Qwen3 and a tokenizer locally (no Hub).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def char_tokenizer():  # noqa: ANN201  (a transformers PreTrainedTokenizerFast)
    """A character-level tokenizer built locally (no Hub): one id per byte, plus <pad>=256 and <eos>=257."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i for i in range(256)} | {"<pad>": 256, "<eos>": 257}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def small_local_model() -> str:
    """A 4-layer Qwen3 with random weights and a character-level tokenizer, saved to a temp dir."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tempfile.mkdtemp(prefix="hf-tpu-demo-")
    char_tokenizer().save_pretrained(path)
    config = Qwen3Config(
        vocab_size=258,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        pad_token_id=256,
        eos_token_id=257,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="Hub id or local directory (default: a small local model)")
    parser.add_argument("--prompt", default="TPUs are")
    args = parser.parse_args()

    on_tpu = torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "tpu"
    if not on_tpu:
        import hf_tpu.emulator

        hf_tpu.emulator.enable()
    model_id = args.model or small_local_model()

    # --- the blog's snippet ---------------------------------------------------------------
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForCausalLM.from_pretrained(model_id, device_map="tpu")
    inputs = tokenizer(args.prompt, return_tensors="pt").to("tpu")
    outputs = model.generate(**inputs, max_new_tokens=64, do_sample=False)
    print(tokenizer.decode(outputs[0], skip_special_tokens=True))
    # ---------------------------------------------------------------------------------------

    new = outputs.shape[1] - inputs["input_ids"].shape[1]
    print(f"\n{new} new tokens on {model.device}; {torch.accelerator.memory_allocated() / 2**20:.1f} MiB of HBM in use")


if __name__ == "__main__":
    main()
