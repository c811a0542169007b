"""Tensor parallel generation: every chip holds 1/N of the weights, all chips generate together.

    hf-tpu launch -n 4 examples/tp_generate.py [MODEL_ID_OR_DIR] [--prompt TEXT]

One process per chip (the launcher sets RANK/WORLD_SIZE; without a TPU it runs emulated chips). Each rank
reads only its slices of the checkpoint. Models whose config ships no TP plan (OPT, T5, Qwen3-VL,
gpt-oss) get hf_tpu's from its registry. Without a model argument, rank 0 builds a small Qwen3 locally.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.distributed import DistributedConfig


def small_local_model(path: Path) -> None:
    """A 4-layer Qwen3 with random weights (4 KV heads, so 1, 2 or 4 chips divide) and a character tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    vocab = {chr(i): i for i in range(256)} | {"<pad>": 256, "<eos>": 257}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    config = Qwen3Config(
        vocab_size=258, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, head_dim=32, pad_token_id=256, eos_token_id=257,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="Hub id or local directory (default: a small local model)")
    parser.add_argument("--prompt", default="TPUs are")
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("run me with: hf-tpu launch -n 4 examples/tp_generate.py")

    dist.init_process_group("tpu_dist")  # transformers reuses it; we need it first to share the demo model
    rank = dist.get_rank()
    model_id = args.model
    if model_id is None:
        model_id = str(Path(tempfile.gettempdir()) / f"hf-tpu-tp-demo-{os.environ.get('MASTER_PORT', '0')}")
        if rank == 0:
            small_local_model(Path(model_id))
        dist.barrier()

    # --- tensor parallel: the plan shards the weights while they are read ----------------------------------
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForCausalLM.from_pretrained(model_id, distributed_config=DistributedConfig(tp_plan="auto"))
    inputs = tokenizer(args.prompt, return_tensors="pt").to("tpu")
    outputs = model.generate(**inputs, max_new_tokens=32, do_sample=False)
    # -------------------------------------------------------------------------------------------------------

    line = torch.tensor([torch.accelerator.memory_allocated()], device="tpu")
    gathered = [torch.zeros_like(line) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, line)
    if rank == 0:
        print(tokenizer.decode(outputs[0], skip_special_tokens=True))
        per_chip = ", ".join(f"{int(g.item()) / 2**20:.2f}" for g in gathered)
        print(f"\n{outputs.shape[1] - inputs['input_ids'].shape[1]} new tokens with tp_size={model.tp_size or 1}; "
              f"MiB of HBM in use per chip: {per_chip}")  # fmt: skip
    if args.model is None and rank == 0:
        shutil.rmtree(model_id, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
