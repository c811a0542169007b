"""experts_implementation="tokamax_ragged_dot" on the emulated TPU agrees with transformers' eager experts.

Tolerances: fp32 logits within 1e-4 of CPU eager (observed ~1e-7); bf16 experts within 2e-2 of the fp32
reference, relative to its largest value (the kernel rounds the activation once, in f32, like the Hub kernel).
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
import torch
import transformers
from torch import nn
from transformers.activations import ACT2FN
from transformers.integrations.moe import grouped_mm_experts_forward, use_experts_implementation

import hf_tpu.kernels
from tests.conftest import run_python

pytestmark = pytest.mark.usefixtures(
    "float32_matmuls"
)  # the kernel against eager experts in float32 (jax_op bodies keep JAX CPU numerics)

IMPL = "tokamax_ragged_dot"


def kernel():
    return hf_tpu.kernels.load_ragged_dot_kernel()


def prompt(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(1, 128, (batch, length), generator=torch.Generator().manual_seed(length))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.cpu().float(), expected.cpu().float()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_logits_and_greedy_tokens_match_eager(family, request):
    path = request.getfixturevalue(f"{family}_dir")
    cpu = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
    tpu = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="tpu", experts_implementation=IMPL)
    assert tpu.get_experts_implementation() == {"": IMPL}
    ids = prompt(9)
    with torch.no_grad():
        expected, actual = cpu(ids).logits, tpu(ids.to("tpu")).logits
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-4, rtol=1e-4)
    greedy = dict(max_new_tokens=8, do_sample=False)
    assert tpu.generate(ids.to("tpu"), **greedy).cpu().tolist() == cpu.generate(ids, **greedy).tolist()


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_training_step_gradients_match_eager_on_cpu(family, request):
    """Backward through the kernel (each forward jax_op paired with its VJP jax_op): the loss and every
    parameter's gradient (experts, router, attention, embeddings) against transformers' eager experts on CPU."""
    path = request.getfixturevalue(f"{family}_dir")
    cpu = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
    tpu = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="tpu", experts_implementation=IMPL)
    cpu.train(), tpu.train()
    ids = prompt(9)
    expected_loss = cpu(ids, labels=ids).loss
    expected_loss.backward()
    loss = tpu(ids.to("tpu"), labels=ids.to("tpu")).loss
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), expected_loss.detach(), atol=1e-5, rtol=1e-5)
    grads = dict(tpu.named_parameters())
    checked = 0
    for name, p in cpu.named_parameters():
        if p.grad is None:
            assert grads[name].grad is None, name
            continue
        assert grads[name].grad is not None and grads[name].grad.device.type == "tpu", name
        assert relative_error(grads[name].grad, p.grad) < 1e-4, (name, relative_error(grads[name].grad, p.grad))
        checked += 1
    experts = [n for n in grads if ".experts." in n and grads[n].grad is not None]
    assert experts and checked == len([p for p in cpu.parameters() if p.grad is not None])


class StubExperts(nn.Module):
    """The minimal ``self`` of transformers' experts contract (as in the Hub kernel's tests)."""

    def __init__(self, config, num_experts=6, hidden=32, inter=16, gate=True, bias=False):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = num_experts, hidden, inter
        out = 2 * inter if gate else inter
        g = torch.Generator().manual_seed(1)
        name = "gate_up_proj" if gate else "up_proj"
        setattr(self, name, nn.Parameter(torch.randn(num_experts, out, hidden, generator=g) / hidden**0.5))
        self.down_proj = nn.Parameter(torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5)
        if bias:
            setattr(self, f"{name}_bias", nn.Parameter(torch.randn(num_experts, out, generator=g) * 0.1))
            self.down_proj_bias = nn.Parameter(torch.randn(num_experts, hidden, generator=g) * 0.1)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, top_k_index, top_k_weights):
        raise AssertionError("dispatch goes through the experts interface")


def make_stub(cls_kwargs, hidden_act="silu", **kwargs):
    config = transformers.PretrainedConfig()
    config.hidden_act, config.model_type = hidden_act, "stub_moe"
    cls = use_experts_implementation(type("StubExperts", (StubExperts,), {}), **cls_kwargs)
    return cls(config, **kwargs)


def routing(tokens=5, top_k=3, num_experts=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 32, generator=g)
    index = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return hidden, index, weights


@pytest.mark.parametrize(
    "flags,stub_kwargs,act",
    [
        ({}, {}, "gelu_pytorch_tanh"),  # the Hub kernel's other activation, fused
        ({"has_gate": False}, {"gate": False}, "relu"),  # NemotronH-style: act(up) only
        ({"has_bias": True}, {"bias": True}, "silu"),
        ({}, {}, "quick_gelu"),  # an activation the fused op does not know: the gate runs in torch
    ],
    ids=["gelu_tanh", "no_gate", "bias", "torch_gate"],
)
def test_layout_flags_match_grouped_mm_reference(flags, stub_kwargs, act):
    stub = make_stub(flags, hidden_act=act, **stub_kwargs)
    hidden, index, weights = routing()
    expected = grouped_mm_experts_forward(stub, hidden, index, weights)
    on_tpu = stub.to("tpu")
    actual = kernel().experts_forward(on_tpu, hidden.to("tpu"), index.to("tpu"), weights.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    on_cpu = kernel().experts_forward(stub.cpu(), hidden, index, weights)  # the pure-torch path
    torch.testing.assert_close(on_cpu, expected, atol=1e-5, rtol=1e-5)


def test_expert_parallel_sentinels_cost_nothing_and_match():
    stub = make_stub({}, num_experts=4)
    hidden, index, weights = routing(tokens=6, top_k=3, num_experts=6)
    weights = torch.where(index >= 4, 0.0, weights)  # picks owned by another rank: sentinel id 4, weight 0
    index = index.clamp(max=4)
    stub._is_expert_parallel = True
    expected = grouped_mm_experts_forward(stub, hidden, index, weights)
    actual = kernel().experts_forward(stub.to("tpu"), hidden.to("tpu"), index.to("tpu"), weights.to("tpu"))
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(actual.cpu()).all()


def test_bfloat16_within_tolerance_of_fp32(qwen3_moe_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, experts_implementation="eager")
    experts = model.model.layers[0].mlp.experts
    _, index, weights = routing(tokens=16, top_k=2, num_experts=8)
    hidden = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = experts(hidden, index, weights)
        # transformers' eager experts in bfloat16 on CPU: what a bf16 user compares with
        cpu_bf16 = copy.deepcopy(experts).to(torch.bfloat16)(hidden.bfloat16(), index, weights.bfloat16())
        experts_bf16 = experts.to("tpu", torch.bfloat16)
        actual = kernel().experts_forward(
            experts_bf16, hidden.to("tpu", torch.bfloat16), index.to("tpu"), weights.to("tpu", torch.bfloat16)
        )
    assert actual.dtype == torch.bfloat16 == cpu_bf16.dtype
    assert relative_error(actual, expected) < 2e-2
    assert relative_error(actual, cpu_bf16) < 2e-2  # both round to bf16, at different points


def test_unsupported_flag_names_the_flag_and_the_model():
    stub = make_stub({"has_post_expert_norm": True})
    hidden, index, weights = routing()
    with pytest.raises(NotImplementedError, match=r"stub_moe \(StubExperts\) has has_post_expert_norm=True"):
        kernel().experts_forward(stub.to("tpu"), hidden.to("tpu"), index.to("tpu"), weights.to("tpu"))


def test_implementation_choice():
    choose = kernel().choose_implementation
    assert choose(8, 2048, 1536, emulated=False, tokamax_version=(0, 0, 17)) == "mosaic_tpu_v2"
    assert choose(512, 2048, 1536, emulated=False, tokamax_version=(0, 0, 12)) == "mosaic"  # v1 fits
    assert choose(8, 2048, 1536, emulated=False, tokamax_version=(0, 0, 12)) == "xla"  # decode: T*k < 128
    assert choose(512, 2048, 1536, emulated=True, tokamax_version=(0, 0, 17)) == "grouped"
    assert choose(512, 2048, 1536, emulated=True, tokamax_version=None, forced="xla") == "lax"
    assert choose(512, 2048, 1536, emulated=True, tokamax_version=(0, 0, 12), forced="xla") == "xla"
    with pytest.raises(ImportError, match=r"hf-tpu\[tpu\]"):
        choose(8, 64, 64, emulated=False, tokamax_version=None)


@pytest.mark.parametrize("transposed", [False, True])
def test_grouped_loop_matches_xla_ragged_dot(transposed):
    # The emulator's default lowering against jax.lax.ragged_dot_general (tokamax's "xla"): empty groups,
    # a group longer than a tile, rows past sum(group_sizes), both weight layouts.
    import jax.numpy as jnp  # the test extra has jax

    jax_impl = importlib.import_module(kernel().__name__ + "._jax_impl")

    g = torch.Generator().manual_seed(0)
    lhs, rhs = torch.randn(40, 32, generator=g), torch.randn(5, 24, 32, generator=g)
    rhs = rhs.transpose(1, 2).contiguous() if transposed else rhs
    sizes = jnp.asarray([7, 0, 19, 3, 6], jnp.int32)
    args = (jnp.asarray(lhs.numpy()), jnp.asarray(rhs.numpy()), sizes, transposed)
    grouped, lax = jax_impl.ragged_dot_general(*args, "grouped"), jax_impl.ragged_dot_general(*args, "lax")
    torch.testing.assert_close(torch.tensor(np.asarray(grouped)), torch.tensor(np.asarray(lax)))
    assert not np.asarray(grouped)[35:].any()


def test_forced_xla_implementation_matches(qwen3_moe_dir):
    k = kernel()
    stub = make_stub({})
    hidden, index, weights = routing()
    expected = grouped_mm_experts_forward(stub, hidden, index, weights)
    k.IMPLEMENTATION = "xla"
    try:
        actual = k.experts_forward(stub.to("tpu"), hidden.to("tpu"), index.to("tpu"), weights.to("tpu"))
    finally:
        k.IMPLEMENTATION = None
    torch.testing.assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.emulator_only("the emulator's path without JAX")
def test_emulator_without_jax_uses_the_torch_path(qwen3_moe_dir):
    proc = run_python(
        f"""
        import sys
        sys.modules["jax"] = None  # as if jax were not installed
        import torch, transformers
        import hf_tpu.emulator
        hf_tpu.emulator.enable(quiet=True)
        torch.set_float32_matmul_precision("highest")  # compared with CPU in float32
        path = {str(qwen3_moe_dir)!r}
        cpu = transformers.AutoModelForCausalLM.from_pretrained(path, experts_implementation="eager")
        tpu = transformers.AutoModelForCausalLM.from_pretrained(
            path, device_map="tpu", experts_implementation="tokamax_ragged_dot")
        ids = torch.randint(1, 128, (2, 5), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = (tpu(ids.to("tpu")).logits.cpu() - cpu(ids).logits).abs().max().item()
        import hf_tpu.kernels
        k = hf_tpu.kernels.load_ragged_dot_kernel()
        print("backend", k._backend(torch.device("tpu")), "ops", len(k._OPS), "diff", diff)
        assert diff < 1e-4
        """
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backend torch ops 0" in proc.stdout
