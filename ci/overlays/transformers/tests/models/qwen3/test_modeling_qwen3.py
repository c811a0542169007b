"""Qwen3 through upstream's common model tests (hf-tpu's small tester; a checkout's own file replaces it)."""

import unittest

from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3Model

from ...generation.test_utils import GenerationTesterMixin
from ...hf_tpu_causal_lm import CausalLMTester
from ...test_modeling_common import ModelTesterMixin


class Qwen3ModelTester(CausalLMTester):
    config_class = Qwen3Config


class Qwen3ModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (Qwen3Model, Qwen3ForCausalLM, Qwen3ForSequenceClassification)

    def setUp(self):
        self.model_tester = Qwen3ModelTester(self)
