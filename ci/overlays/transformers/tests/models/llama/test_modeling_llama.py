"""Llama through upstream's common model tests (hf-tpu's small tester; a checkout's own file replaces it)."""

import unittest

from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, LlamaModel

from ...generation.test_utils import GenerationTesterMixin
from ...hf_tpu_causal_lm import CausalLMTester
from ...test_modeling_common import ModelTesterMixin


class LlamaModelTester(CausalLMTester):
    config_class = LlamaConfig


class LlamaModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (LlamaModel, LlamaForCausalLM, LlamaForSequenceClassification)

    def setUp(self):
        self.model_tester = LlamaModelTester(self)
