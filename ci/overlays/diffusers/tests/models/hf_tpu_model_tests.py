"""Model tests for diffusers' denoisers, kept by hf-tpu for runs from the diffusers sdist.

The sdist ships ``tests/testing_utils.py`` (the device selection) but none of the model tests; these
cover what upstream's ``ModelTesterMixin`` checks first: shapes, determinism, return types, a save /
load round trip, bf16 loading, a training step, gradient checkpointing, moving between devices, group
offloading. A
checkout's own test files replace this directory's (the overlay never overwrites).
"""

from __future__ import annotations

import copy
import tempfile

import torch

from ..testing_utils import torch_device

# the same computation twice on one device: only reduction order may differ
SAME_DEVICE = {"atol": 1e-5, "rtol": 1e-5}


class DenoiserTesterMixin:
    """Set ``model_class`` and implement ``init_kwargs()`` and ``inputs()`` (on ``torch_device``)."""

    model_class = None
    output_shape: tuple = ()

    def init_kwargs(self) -> dict:
        raise NotImplementedError

    def inputs(self) -> dict:
        raise NotImplementedError

    def build(self, **overrides):
        torch.manual_seed(0)
        return self.model_class(**{**self.init_kwargs(), **overrides}).to(torch_device).eval()

    def forward(self, model, inputs=None):
        with torch.no_grad():
            return model(**(inputs or self.inputs())).sample

    def test_output_shape(self):
        output = self.forward(self.build())
        self.assertEqual(tuple(output.shape), self.output_shape)
        self.assertEqual(output.device.type, torch.device(torch_device).type)
        self.assertTrue(torch.isfinite(output).all())

    def test_determinism(self):
        model, inputs = self.build(), self.inputs()
        torch.testing.assert_close(self.forward(model, inputs), self.forward(model, inputs), **SAME_DEVICE)

    def test_return_dict_false(self):
        model, inputs = self.build(), self.inputs()
        with torch.no_grad():
            as_tuple = model(**inputs, return_dict=False)[0]
        torch.testing.assert_close(as_tuple, self.forward(model, inputs), **SAME_DEVICE)

    def test_save_load_round_trip(self):
        model, inputs = self.build(), self.inputs()
        with tempfile.TemporaryDirectory() as directory:
            model.save_pretrained(directory)
            loaded = self.model_class.from_pretrained(directory).to(torch_device).eval()
        for name, tensor in model.state_dict().items():
            self.assertTrue(torch.equal(tensor.cpu(), loaded.state_dict()[name].cpu()), name)
        torch.testing.assert_close(self.forward(loaded, inputs), self.forward(model, inputs), **SAME_DEVICE)

    def test_load_in_bfloat16(self):
        with tempfile.TemporaryDirectory() as directory:
            self.build().save_pretrained(directory)
            loaded = self.model_class.from_pretrained(directory, torch_dtype=torch.bfloat16).to(torch_device)
        self.assertTrue(all(p.dtype == torch.bfloat16 for p in loaded.parameters()))
        inputs = {k: v.to(torch.bfloat16) if torch.is_floating_point(v) else v for k, v in self.inputs().items()}
        self.assertTrue(torch.isfinite(self.forward(loaded, inputs).float()).all())

    def _grads(self, model):
        model.train()
        output = model(**self.inputs()).sample
        loss = torch.nn.functional.mse_loss(output, torch.zeros_like(output))
        loss.backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    def test_training_step(self):
        model = self.build()
        grads = self._grads(model)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        self.assertTrue(grads, "no parameter received a gradient")
        self.assertTrue(all(torch.isfinite(g).all() for g in grads.values()))
        self.assertLessEqual(set(grads), trainable)

    def test_gradient_checkpointing_same_gradients(self):
        if not self.model_class._supports_gradient_checkpointing:
            self.skipTest(f"{self.model_class.__name__} does not support gradient checkpointing")
        plain = self.build()
        checkpointed = copy.deepcopy(plain)
        checkpointed.enable_gradient_checkpointing()
        expected, got = self._grads(plain), self._grads(checkpointed)
        self.assertEqual(set(expected), set(got))
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)

    def test_to_device_and_back(self):
        torch.manual_seed(0)
        on_cpu = self.model_class(**self.init_kwargs())
        back = copy.deepcopy(on_cpu).to(torch_device).to("cpu")
        for name, tensor in on_cpu.state_dict().items():
            self.assertTrue(torch.equal(tensor, back.state_dict()[name]), name)

    def test_group_offloading_same_output(self):
        if torch_device == "cpu":
            self.skipTest("group offloading onloads to an accelerator (upstream: @require_torch_accelerator)")
        model, inputs = self.build(), self.inputs()
        expected = self.forward(model, inputs)
        offloaded = self.model_class(**self.init_kwargs()).eval()
        offloaded.load_state_dict(model.state_dict())
        offloaded.enable_group_offload(
            onload_device=torch.device(torch_device), offload_type="leaf_level", use_stream=True
        )
        torch.testing.assert_close(self.forward(offloaded, inputs), expected, **SAME_DEVICE)
