"""Qwen3-MoE through upstream's common model tests (hf-tpu's small tester; a checkout's own file replaces it)."""

import unittest

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3MoeModel

from ...generation.test_utils import GenerationTesterMixin
from ...hf_tpu_causal_lm import CausalLMTester
from ...test_modeling_common import ModelTesterMixin


class Qwen3MoeModelTester(CausalLMTester):
    config_class = Qwen3MoeConfig
    # four experts, two per token, every layer sparse
    config_overrides = {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "decoder_sparse_step": 1,
    }


class Qwen3MoeModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (Qwen3MoeModel, Qwen3MoeForCausalLM)

    def setUp(self):
        self.model_tester = Qwen3MoeModelTester(self)
