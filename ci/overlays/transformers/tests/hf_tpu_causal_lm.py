"""A small model tester for decoder-only LMs, kept by hf-tpu for runs from the transformers sdist.

The sdist ships upstream's common model tests (``tests/test_modeling_common.py``) but not the model
directories nor ``tests/causal_lm_tester.py``; this is the least a family needs to run them: a tiny
config and inputs. A checkout's own ``tests/models/`` replace these files (the overlay never
overwrites).
"""

from __future__ import annotations

from transformers.testing_utils import torch_device

from .test_modeling_common import ids_tensor, random_attention_mask


class CausalLMTester:
    """Tiny configs and inputs for ``ModelTesterMixin`` (two layers, width 32, GQA 4:2)."""

    config_class = None  # set by each family
    config_overrides: dict = {}

    def __init__(self, parent, batch_size: int = 2, seq_length: int = 7) -> None:
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        self.vocab_size = 99
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 2
        self.intermediate_size = 37
        self.max_position_embeddings = 64

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.hidden_size // self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **self.config_overrides,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).to(torch_device)
        attention_mask = random_attention_mask([self.batch_size, self.seq_length]).to(torch_device)
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}
