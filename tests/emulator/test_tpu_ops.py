"""``torch.tpu.ops`` / ``torch.ops.tpu`` and the smaller TorchTPU surface the contract test found missing.

Schemas and names are checked against the real wheel by tests/contract; here, what the emulated ops compute:
each against a CPU reference at precision "highest" (exact float32 matmuls), so the comparison is tight.
"""

from __future__ import annotations

import enum
import functools
import warnings

import jax
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_python

pytestmark = pytest.mark.filterwarnings("ignore:<TorchTpu/ApiStage/ExperimentalApi/>")


@pytest.fixture(autouse=True)
def highest():
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        yield


def test_ragged_dot_and_its_gradients_match_cpu():
    torch.manual_seed(0)
    lhs, rhs = torch.randn(7, 4), torch.randn(3, 4, 5)
    sizes = torch.tensor([2, 0, 5])
    want = torch.cat([lhs[:2] @ rhs[0], lhs[2:] @ rhs[2]])
    x, w = lhs.to("tpu").requires_grad_(), rhs.to("tpu").requires_grad_()
    got = torch.tpu.ops.ragged_dot(x, w, sizes.to("tpu"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    grad = torch.randn(7, 5)
    got.backward(grad.to("tpu"))
    x_cpu, w_cpu = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    torch.cat([x_cpu[:2] @ w_cpu[0], x_cpu[2:] @ w_cpu[2]]).backward(grad)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad.cpu(), torch.nan_to_num(w_cpu.grad), rtol=1e-6, atol=1e-6)  # group 1: zeros
    weight_grad = torch.tpu.ops.ragged_dot_weight_grad(x.detach(), grad.to("tpu"), sizes.to("tpu"))
    torch.testing.assert_close(weight_grad.cpu(), w.grad.cpu())
    out = torch.empty(7, 5, device="tpu")
    assert torch.tpu.ops.ragged_dot(x.detach(), w.detach(), sizes.to("tpu"), out=out) is out


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_max_pool_without_indices_and_its_backward_match_cpu(dims):
    torch.manual_seed(dims)
    x = torch.randn(2, 3, *([9] * dims))
    args = ([3] * dims, [2] * dims, [1] * dims, [1] * dims, True)
    pool = getattr(torch.tpu.ops, f"max_pool{dims}d")
    backward = getattr(torch.tpu.ops, f"max_pool{dims}d_backward")
    want = getattr(F, f"max_pool{dims}d")(x, *args)
    torch.testing.assert_close(pool(x.to("tpu"), *args).cpu(), want)
    grad = torch.randn_like(want)
    leaf = x.clone().requires_grad_()
    getattr(F, f"max_pool{dims}d")(leaf, *args).backward(grad)
    torch.testing.assert_close(backward(grad.to("tpu"), x.to("tpu"), *args).cpu(), leaf.grad)


def test_ops_refuse_cpu_tensors():
    with pytest.raises(NotImplementedError, match="'tpu::_ragged_dot' with arguments from the 'CPU' backend"):
        torch.ops.tpu._ragged_dot(torch.ones(2, 2), torch.ones(1, 2, 2), torch.tensor([2]))
    barrier = torch.tpu.ops.optimization_barrier([torch.ones(2, device="tpu"), torch.zeros(3, device="tpu")])
    assert [t.shape for t in barrier] == [torch.Size([2]), torch.Size([3])] and float(barrier[0].sum()) == 2.0


@pytest.mark.emulator_only("SparseCore ops: the emulator has no SparseCore (nor has XLA:CPU)")
def test_unemulated_ops_say_so():
    with pytest.raises(NotImplementedError, match="SparseCore embedding op.*runs on the chip only"):
        torch.tpu.ops.sparse_iota(torch.tensor([0, 2, 4], dtype=torch.int32, device="tpu"), 4, 2)


def test_splash_sdpa_is_causal_sliding_window_attention():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 128, 8), torch.randn(1, 2, 128, 8), torch.randn(1, 2, 128, 8)
    with pytest.raises(ValueError, match=r"enable_gqa \(False\) does not match inputs: n_heads=4, n_kv_heads=2"):
        torch.tpu.ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), local_window_size=2)
    with pytest.raises(ValueError, match="bkv_compute=6 must be a multiple of 128"):  # the kernel's key tiles
        short = torch.randn(1, 4, 6, 8, device="tpu")
        torch.tpu.ops.splash_sdpa(short, short, short, local_window_size=2)
    got = torch.tpu.ops.splash_sdpa(q.to("tpu"), k.to("tpu"), v.to("tpu"), local_window_size=2, enable_gqa=True)
    i = torch.arange(128)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 2)
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask)
    torch.testing.assert_close(got.cpu(), want, atol=2e-2, rtol=0)  # TPU attention runs in bf16 (gap)


def test_jagged_padding_round_trip():
    nt = torch.nested.nested_tensor([torch.ones(3, 4), torch.ones(2, 4)], layout=torch.jagged, device="tpu")
    padded = torch.tpu.ops.align_jagged_to_multiple(nt, multiple=8)
    assert padded.values().shape[0] == 8 and torch.equal(padded.offsets(), nt.offsets())
    assert torch.tpu.ops.strip_jagged_padding(padded, valid_tokens=5).values().shape[0] == 5


class Mode(enum.Enum):
    SAME = "same"
    DOUBLE = "double"


def scale(x: jax.Array, mode: Mode, *, times: int = 1) -> jax.Array:
    return x * times * (2 if mode is Mode.DOUBLE else 1)


def nothing(x: jax.Array) -> None:
    return None


def test_jax_op_schemas_follow_torch_tpu():
    """ints are SymInt, an Enum travels as its values' type (str here), keyword-only statics and partials work,
    None returns are allowed: what TorchTPU's jax_op derives (tests/contract compares every kind with the wheel's)."""
    op = torch.tpu.pallas.jax_op("tpu_ops_test::scale", scale)
    assert type(op).__mro__[1] is torch._library.custom_ops.CustomOpDef
    assert str(op._opoverload._schema) == "tpu_ops_test::scale(Tensor x, str mode, *, SymInt times=1) -> Tensor"
    x = torch.ones(3, device="tpu")
    assert torch.equal(op(x, Mode.DOUBLE, times=3).cpu(), torch.full((3,), 6.0))
    assert torch.tpu.pallas.jax_op("tpu_ops_test::nothing", nothing)(x) is None
    fixed = torch.tpu.pallas.jax_op("tpu_ops_test::fixed", functools.partial(scale, times=5))
    assert str(fixed._opoverload._schema) == "tpu_ops_test::fixed(Tensor x, str mode) -> Tensor"
    compiled = torch.compile(lambda t: op(t, Mode.SAME, times=2), backend="tpu")
    assert torch.equal(compiled(x).cpu(), torch.full((3,), 2.0))


def test_small_surface_pieces():
    x = torch.ones(2, device="tpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert isinstance(torch.tpu.device_of(x), torch.tpu.device_of)
        with torch.tpu.device_of(torch.ones(2)):  # off the TPU: a no-op
            pass
        config = torch.tpu.profiler.TpuProfilerConfig(worker_rank="3")
        assert isinstance(config, torch.profiler._ExperimentalConfig)
        with pytest.raises(ValueError, match="cannot contain"):
            torch.tpu.profiler.TpuProfilerConfig(worker_rank="a:b")
        with pytest.raises(TypeError, match="unexpected keyword argument 'levels'"):
            torch.tpu.profiler.TpuProfilerConfig(levels=3)
        assert torch.tpu.distributed.window_num_stripes == 4 and torch.tpu.distributed.window_stripe_chunk_mb == 8
        torch.tpu.distributed.window_num_stripes = 2
        assert torch.tpu.distributed.window_num_stripes == 2
        torch.tpu.distributed.window_num_stripes = 4
        with pytest.raises(RuntimeError, match="expected window_stripe_chunk_mb to be > 0, got 0"):
            torch.tpu.distributed.window_stripe_chunk_mb = 0
        doubled = torch.tpu.distributed.spmd_safe(lambda t: t * 2)
        assert torch.equal(doubled(x).cpu(), torch.full((2,), 2.0))
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            torch.tpu.pallas.get_pallas_mesh("x")
    assert torch._dynamo.config.allow_rnn and torch._dynamo.config.trace_autograd_ops  # set as TorchTPU sets them


@pytest.mark.emulator_only("an emulated 4-chip host (XLA:CPU is one device, with no TPU topology)")
def test_python_m_torch_tpu_distributed_prints_the_launch_environment():
    proc = run_python(
        "import runpy, sys; sys.argv = ['x']; runpy.run_module('torch.tpu.distributed', run_name='__main__')",
        env={"HF_TPU_EMULATE": "1", "HF_TPU_EMULATOR_CHIPS": "4", "MASTER_PORT": "1234"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split("=", 1) for line in proc.stdout.strip().splitlines())
    assert lines["WORLD_SIZE"] == "4" and lines["NODE_RANK"] == '"0"' and lines["MASTER_PORT"] == '"1234"'
    assert lines["TORCH_TPU_TOPOLOGY"] == '"1,4,1"' and lines["TORCH_TPU_SLICEBUILDER_ADDRESSES"].count(",") == 3


def test_flex_attention_on_tpu_runs_as_masked_sdpa():
    """TorchTPU's import patches flex_attention for tpu tensors (torch refuses the device otherwise)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, 1, 1, 8, 8, device="tpu")
    got = flex_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), block_mask=mask)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got.cpu(), want, atol=3e-2, rtol=0)  # TPU attention runs in bf16 (gap)
