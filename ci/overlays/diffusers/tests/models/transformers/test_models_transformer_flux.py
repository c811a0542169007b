"""Flux's transformer through hf-tpu's denoiser tests (a checkout's own file replaces this one)."""

import unittest

import torch
from diffusers import FluxTransformer2DModel

from ...testing_utils import torch_device
from ..hf_tpu_model_tests import DenoiserTesterMixin


class FluxTransformerTests(DenoiserTesterMixin, unittest.TestCase):
    model_class = FluxTransformer2DModel
    output_shape = (2, 16, 4)

    def init_kwargs(self):
        return {
            "patch_size": 1,
            "in_channels": 4,
            "num_layers": 1,
            "num_single_layers": 1,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "pooled_projection_dim": 32,
            "axes_dims_rope": [4, 4, 8],
        }

    def inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        return {
            "hidden_states": torch.randn(2, 16, 4, generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn(2, 6, 32, generator=generator).to(torch_device),
            "pooled_projections": torch.randn(2, 32, generator=generator).to(torch_device),
            "img_ids": torch.randn(16, 3, generator=generator).to(torch_device),
            "txt_ids": torch.randn(6, 3, generator=generator).to(torch_device),
            "timestep": torch.tensor([0.1, 0.7]).to(torch_device),
        }
