"""Stable Diffusion 3 with its transformer and its T5 text encoder sharded over N chips.

    hf-tpu launch -n 4 examples/diffusers_tp.py [PIPELINE_DIR] [--prompt TEXT] [--check]

The transformer loads with ``parallel_config=ParallelConfig(tensor_parallel_config=TensorParallelConfig(...))``
(diffusers ships no SD3 plan; hf_tpu registers one). The T5 encoder, the component too large for a small chip,
loads with ``DistributedConfig(tp_size=N)`` and hf_tpu's T5 plan (the Diffusers TPU guide's recipe). The CLIP
encoders and the VAE are small and sit whole on every chip. Without a directory, rank 0 builds a tiny random
SD3 pipeline locally (no Hub). ``--check`` also runs it on one chip and prints the largest pixel difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist


def tiny_pipeline(path: Path) -> None:
    """A random SD3 pipeline with character tokenizers; T5 width 64 so 1, 2 or 4 chips divide its 4 heads."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        PreTrainedTokenizerFast,
        T5Config,
        T5EncoderModel,
    )

    vocab = {chr(i): i for i in range(256)} | {"<pad>": 256, "<eos>": 257}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", model_max_length=77
    )
    torch.manual_seed(0)
    clip = CLIPTextConfig(
        vocab_size=258, hidden_size=32, intermediate_size=64, projection_dim=32, num_attention_heads=4,
        num_hidden_layers=2, pad_token_id=256, eos_token_id=257, bos_token_id=257,
    )  # fmt: skip
    for name in ("text_encoder", "text_encoder_2"):
        CLIPTextModelWithProjection(clip).save_pretrained(path / name)
    for name in ("tokenizer", "tokenizer_2", "tokenizer_3"):
        tokenizer.save_pretrained(path / name)
    t5 = T5Config(vocab_size=258, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, pad_token_id=256)
    T5EncoderModel(t5).save_pretrained(path / "text_encoder_3")
    SD3Transformer2DModel(
        sample_size=16, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=64, pooled_projection_dim=64, out_channels=4,
    ).save_pretrained(path / "transformer")  # fmt: skip
    AutoencoderKL(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=4,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035,
    ).save_pretrained(path / "vae")  # fmt: skip
    FlowMatchEulerDiscreteScheduler().save_pretrained(path / "scheduler")


def load(path: str, tp: int):
    """The pipeline with transformer and T5 sharded over ``tp`` chips (``tp=1``: everything whole on the chip)."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ParallelConfig,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
        TensorParallelConfig,
    )
    from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel
    from transformers.distributed import DistributedConfig

    if tp > 1:
        # --- tensor parallel: each rank reads and keeps only its slices -----------------------------------------
        parallel = ParallelConfig(tensor_parallel_config=TensorParallelConfig(tp_degree=tp))
        transformer = SD3Transformer2DModel.from_pretrained(path, subfolder="transformer", parallel_config=parallel)
        text_encoder_3 = T5EncoderModel.from_pretrained(
            path, subfolder="text_encoder_3", distributed_config=DistributedConfig(tp_size=tp)
        )
        # --------------------------------------------------------------------------------------------------------
    else:
        transformer = SD3Transformer2DModel.from_pretrained(path, subfolder="transformer", device_map="tpu")
        text_encoder_3 = T5EncoderModel.from_pretrained(path, subfolder="text_encoder_3", device_map="tpu")
    whole = {
        name: CLIPTextModelWithProjection.from_pretrained(path, subfolder=name, device_map="tpu")
        for name in ("text_encoder", "text_encoder_2")
    }
    tokenizers = {name: AutoTokenizer.from_pretrained(path, subfolder=name) for name in ("tokenizer", "tokenizer_2")}
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder="scheduler"),
        vae=AutoencoderKL.from_pretrained(path, subfolder="vae", device_map="tpu"),
        text_encoder_3=text_encoder_3,
        tokenizer_3=AutoTokenizer.from_pretrained(path, subfolder="tokenizer_3"),
        **whole,
        **tokenizers,
    )


def generate(pipe, prompt: str) -> torch.Tensor:
    # The same CPU generator seed on every rank: TP ranks must start from the same latents.
    out = pipe(
        prompt, height=16, width=16, num_inference_steps=4, guidance_scale=1.0, output_type="pt",
        generator=torch.Generator("cpu").manual_seed(0),
    )  # fmt: skip
    return out.images.cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", nargs="?", help="local SD3 pipeline directory (default: a tiny random one)")
    parser.add_argument("--prompt", default="a TPU in a field of flowers")
    parser.add_argument("--check", action="store_true", help="compare with the same pipeline on one chip")
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("run me with: hf-tpu launch -n 4 examples/diffusers_tp.py")

    dist.init_process_group("tpu_dist")
    rank, n = dist.get_rank(), dist.get_world_size()
    path = args.pipeline
    if path is None:
        path = str(Path(tempfile.gettempdir()) / f"hf-tpu-sd3-tp-demo-{os.environ.get('MASTER_PORT', '0')}")
        if rank == 0:
            tiny_pipeline(Path(path))
        dist.barrier()

    pipe = load(path, n)
    image = generate(pipe, args.prompt)
    block = pipe.transformer.transformer_blocks[0].attn
    if rank == 0:
        print(f"image {tuple(image.shape)} on {n} chips; transformer to_q shard {tuple(block.to_q.weight.to_local().shape)}"
              f", heads per chip {block.heads}; HBM in use on rank 0: {torch.accelerator.memory_allocated() / 2**20:.2f} MiB")  # fmt: skip
        if args.check:
            del pipe
            reference = generate(load(path, 1), args.prompt)
            print(f"max |TP - one chip| = {(image - reference).abs().max().item():.2e}")
    dist.barrier()
    if args.pipeline is None and rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
