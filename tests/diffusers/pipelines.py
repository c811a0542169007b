"""Tiny diffusers pipelines built from configs, with tokenizers made locally (no Hub).

Each builder saves the pipeline under ``path`` and returns it, so tests load it back with
``from_pretrained`` exactly as users load a Hub checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<|startoftext|>", "<pad>", "<|endoftext|>"]  # ids 0, 1, 2 as the tiny CLIP configs expect


def byte_tokenizer(model_max_length: int):
    """A byte-level BPE tokenizer with no merges: every prompt is its UTF-8 bytes (259 ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate(SPECIALS + sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SPECIALS[0],
        pad_token=SPECIALS[1],
        eos_token=SPECIALS[2],
        unk_token=SPECIALS[1],
        model_max_length=model_max_length,
    )


def _clip(with_projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        bos_token_id=0, eos_token_id=2, pad_token_id=1, vocab_size=300, hidden_size=32, intermediate_size=37,
        num_attention_heads=4, num_hidden_layers=2, hidden_act="gelu", projection_dim=32, max_position_embeddings=77,
    )  # fmt: skip
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def _t5():
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(vocab_size=300, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0)
    )


def _vae(latent_channels: int, channels: tuple[int, ...] = (8, 8)):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=channels, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * len(channels), up_block_types=("UpDecoderBlock2D",) * len(channels),
        latent_channels=latent_channels, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0609, scaling_factor=1.5035,
    )  # fmt: skip


def build_sd3(
    path: Path, *, num_layers: int = 1, heads: int = 4, head_dim: int = 8, vae_channels=(8, 8), seed: int = 0
):
    """Stable Diffusion 3 (two CLIP encoders, no T5 — the pipeline allows it), MMDiT transformer.

    The defaults are tiny (tests); bench/diffusion.py asks for a larger transformer and VAE.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    pipe = StableDiffusion3Pipeline(
        transformer=SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=num_layers,
            attention_head_dim=head_dim,
            num_attention_heads=heads,
            caption_projection_dim=heads * head_dim,
            joint_attention_dim=64,
            pooled_projection_dim=64,
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(latent_channels=4, channels=vae_channels),
        text_encoder=_clip(True),
        tokenizer=byte_tokenizer(16),
        text_encoder_2=_clip(True),
        tokenizer_2=byte_tokenizer(16),
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.save_pretrained(path)
    return pipe


def build_flux(path: Path, *, seed: int = 0):
    """Flux (CLIP + T5), latents packed 2x2, rotary position ids."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    pipe = FluxPipeline(
        transformer=FluxTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8],
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_vae(latent_channels=4),
        text_encoder=_clip(False),
        tokenizer=byte_tokenizer(16),
        text_encoder_2=_t5(),
        tokenizer_2=byte_tokenizer(16),
    )
    pipe.save_pretrained(path)
    return pipe


def build_qwenimage(path: Path, *, seed: int = 0):
    """QwenImage: a Qwen2.5-VL text encoder (its chat template is dropped by the pipeline), 3-D VAE."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    text_config = {
        "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "rope_theta": 1000000.0,
        "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
    }  # fmt: skip
    encoder_config = Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=300, vision_start_token_id=297, vision_end_token_id=298, vision_token_id=299,
    )  # fmt: skip
    z_dim = 4
    pipe = QwenImagePipeline(
        transformer=QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=3,
            joint_attention_dim=16,
            guidance_embeds=False,
            axes_dims_rope=(8, 4, 4),
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=AutoencoderKLQwenImage(
            base_dim=z_dim * 6,
            z_dim=z_dim,
            dim_mult=[1, 2, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True],
            latents_mean=[0.0] * z_dim,
            latents_std=[1.0] * z_dim,
        ),
        text_encoder=Qwen2_5_VLForConditionalGeneration(encoder_config),
        tokenizer=byte_tokenizer(64),
    )
    pipe.save_pretrained(path)
    return pipe


def build_sdxl(path: Path, *, seed: int = 0):
    """Stable Diffusion XL: a UNet with text-time conditioning and two CLIP encoders."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    torch.manual_seed(seed)
    pipe = StableDiffusionXLPipeline(
        unet=UNet2DConditionModel(
            block_out_channels=(8, 16),
            layers_per_block=1,
            sample_size=32,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(2, 4),
            use_linear_projection=True,
            addition_embed_type="text_time",
            addition_time_embed_dim=8,
            transformer_layers_per_block=(1, 1),
            projection_class_embeddings_input_dim=80,
            cross_attention_dim=64,
            norm_num_groups=1,
        ),
        scheduler=EulerDiscreteScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            timestep_spacing="leading",
            steps_offset=1,
        ),
        vae=_vae(latent_channels=4),
        text_encoder=_clip(False),
        tokenizer=byte_tokenizer(16),
        text_encoder_2=_clip(True),
        tokenizer_2=byte_tokenizer(16),
    )
    pipe.save_pretrained(path)
    return pipe


BUILDERS = {"sd3": build_sd3, "flux": build_flux, "qwenimage": build_qwenimage, "sdxl": build_sdxl}

# Components a builder leaves out must be named as None when loading back.
LOAD_KWARGS = {"sd3": {"text_encoder_3": None, "tokenizer_3": None}}
# Small call arguments every pipeline accepts (Flux's T5 length defaults to 512).
CALL_KWARGS = {"flux": {"max_sequence_length": 16}, "qwenimage": {"max_sequence_length": 16}}


def load(name: str, path: Path, **kwargs):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(path, **LOAD_KWARGS.get(name, {}), **kwargs)


def call_kwargs(name: str, **overrides) -> dict:
    base = dict(prompt="a photo of a cat", num_inference_steps=2, height=32, width=32, output_type="np")
    return base | CALL_KWARGS.get(name, {}) | overrides
