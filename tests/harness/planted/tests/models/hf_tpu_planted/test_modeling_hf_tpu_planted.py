"""Planted outcomes for the harness's own CI job (tests/harness): the harness must find each of them.

Copied into a copy of the fetched transformers tests as the family ``hf_tpu_planted``; never part
of a real run.
"""

import os
import unittest

import torch
from transformers.testing_utils import torch_device


class PlantedTest(unittest.TestCase):
    def test_a_passes_everywhere(self):
        self.assertEqual(torch.ones(3, device=torch_device).sum().item(), 3.0)

    def test_b_aborts_on_tpu(self):
        # a process abort, as an op that kills TorchTPU's runtime would: must cost this test only
        if torch_device == "tpu":
            os.abort()

    def test_c_runs_after_the_abort(self):
        self.assertEqual(torch.arange(4, device=torch_device).sum().item(), 6)

    def test_d_tpu_only_op(self):
        # cholesky is a TorchTPU gap (hf-tpu gaps --show cholesky), closed by a workaround the job turns off
        matrix = torch.eye(4, device=torch_device) * 4.0
        factor = torch.linalg.cholesky(matrix)
        torch.testing.assert_close(factor.cpu(), torch.eye(4) * 2.0)

    def test_e_tpu_only_precision(self):
        # float32 matmuls round their operands to bfloat16 on a chip unless precision is "highest"
        generator = torch.Generator().manual_seed(0)
        a, b = torch.randn(64, 64, generator=generator), torch.randn(64, 64, generator=generator)
        torch.testing.assert_close((a.to(torch_device) @ b.to(torch_device)).cpu(), a @ b, atol=1e-4, rtol=1e-4)

    def test_f_fails_everywhere(self):
        self.assertEqual(torch.zeros(1, device=torch_device).item(), 1.0, "planted: fails on CPU too")
