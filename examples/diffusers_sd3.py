"""The blog's snippet: Stable Diffusion 3 on the TPU, the transformer compiled with backend="tpu".

    python examples/diffusers_sd3.py [MODEL_ID_OR_DIR] [--steps N] [--size PX] [--out FILE]

On a TPU VM this runs on the chip through TorchTPU (try stabilityai/stable-diffusion-3-medium-diffusers).
Anywhere else it switches the emulated TPU on and, without a model argument, builds a small SD3
pipeline with random weights and byte-level tokenizers locally (no Hub): the image is noise, the
mechanics (placement, compile, graph reuse) are the real ones.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from diffusers import StableDiffusion3Pipeline


def small_local_pipeline() -> str:
    """A 2-layer SD3 transformer, a small VAE and two CLIP text encoders, saved to a temp dir."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, PreTrainedTokenizerFast

    def tokenizer() -> PreTrainedTokenizerFast:  # every prompt is its UTF-8 bytes
        specials = ["<|startoftext|>", "<pad>", "<|endoftext|>"]
        vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
        backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=specials[0], pad_token=specials[1],
                                       eos_token=specials[2], model_max_length=77)  # fmt: skip

    def text_encoder() -> CLIPTextModelWithProjection:
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
            projection_dim=64, bos_token_id=0, pad_token_id=1, eos_token_id=2, max_position_embeddings=77,
        ))  # fmt: skip

    torch.manual_seed(0)
    pipe = StableDiffusion3Pipeline(
        transformer=SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            num_layers=2,
            attention_head_dim=32,
            num_attention_heads=4,
            caption_projection_dim=128,
            joint_attention_dim=128,
            pooled_projection_dim=128,
        ),  # fmt: skip
        vae=AutoencoderKL(
            in_channels=3,
            out_channels=3,
            latent_channels=16,
            block_out_channels=(32, 32, 32, 32),
            layers_per_block=1,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            norm_num_groups=8,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        ),  # fmt: skip
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        text_encoder=text_encoder(),
        tokenizer=tokenizer(),
        text_encoder_2=text_encoder(),
        tokenizer_2=tokenizer(),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    path = tempfile.mkdtemp(prefix="hf-tpu-sd3-")
    pipe.save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="Hub id or local directory (default: a small local pipeline)")
    parser.add_argument("--prompt", default="A cat holding a sign that says hello world")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--size", type=int, default=None, help="height and width (default: the model's)")
    parser.add_argument("--out", default="sd3_tpu.png")
    args = parser.parse_args()

    on_tpu = torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "tpu"
    if not on_tpu:
        import hf_tpu.emulator

        hf_tpu.emulator.enable()
    model_id = args.model or small_local_pipeline()
    extra = {} if args.model else {"text_encoder_3": None, "tokenizer_3": None}
    size = (
        {"height": args.size, "width": args.size}
        if args.size
        else ({} if args.model else {"height": 128, "width": 128})
    )

    # --- the blog's snippet ---------------------------------------------------------------
    pipe = StableDiffusion3Pipeline.from_pretrained(model_id, dtype=torch.bfloat16, **extra)
    pipe.to("tpu")
    pipe.transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
    # ---------------------------------------------------------------------------------------

    import hf_tpu

    for attempt in ("first (compiles)", "second (reuses the graph)"):
        with hf_tpu.watch_compiles() as report:
            start = time.perf_counter()
            image = pipe(args.prompt, num_inference_steps=args.steps, guidance_scale=7.0, **size,
                         generator=torch.Generator("tpu").manual_seed(0)).images[0]  # fmt: skip
            seconds = time.perf_counter() - start
        print(f"{attempt}: {seconds:.2f} s, {report.count()} graph(s) compiled")
    image.save(args.out)
    print(f"saved {args.out} ({image.width}x{image.height}) from {pipe.transformer.device}")


if __name__ == "__main__":
    main()
