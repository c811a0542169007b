"""SD3's transformer through hf-tpu's denoiser tests (a checkout's own file replaces this one)."""

import unittest

import torch
from diffusers import SD3Transformer2DModel

from ...testing_utils import torch_device
from ..hf_tpu_model_tests import DenoiserTesterMixin


class SD3TransformerTests(DenoiserTesterMixin, unittest.TestCase):
    model_class = SD3Transformer2DModel
    output_shape = (2, 4, 8, 8)

    def init_kwargs(self):
        return {
            "sample_size": 8,
            "patch_size": 1,
            "in_channels": 4,
            "num_layers": 2,
            "attention_head_dim": 8,
            "num_attention_heads": 4,
            "caption_projection_dim": 32,
            "joint_attention_dim": 32,
            "pooled_projection_dim": 64,
            "out_channels": 4,
        }

    def inputs(self):
        generator = torch.Generator("cpu").manual_seed(0)
        return {
            "hidden_states": torch.randn(2, 4, 8, 8, generator=generator).to(torch_device),
            "encoder_hidden_states": torch.randn(2, 6, 32, generator=generator).to(torch_device),
            "pooled_projections": torch.randn(2, 64, generator=generator).to(torch_device),
            "timestep": torch.tensor([10, 500]).to(torch_device),
        }
