"""Real storage semantics on the device: views alias, in-place ops land in place, data_ptrs are real."""

from __future__ import annotations

import pytest
import torch

from tests.gaps.test_workarounds import without


def tpu(x: torch.Tensor) -> torch.Tensor:
    return x.to("tpu")


def test_round_trip_all_dtypes():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.complex64):
        x = (torch.arange(12) % 3).to(dtype).reshape(3, 4)
        assert torch.equal(tpu(x).cpu(), x)


def test_views_alias_device_memory():
    x = tpu(torch.zeros(4, 4))
    row = x[1]
    col = x[:, 2]
    t = x.t()
    flat = x.view(16)
    row.fill_(1.0)
    col.add_(2.0)
    assert x._is_view() is False and row._base is x
    assert flat.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert t.stride() == (1, 4) and not t.is_contiguous()
    expected = torch.zeros(4, 4)
    expected[1] = 1.0
    expected[:, 2] += 2.0
    assert torch.equal(x.cpu(), expected)
    assert torch.equal(flat.cpu(), expected.view(16))
    assert row.storage_offset() == 4 and col.storage_offset() == 2


def test_inplace_and_out_results_land_in_device_memory():
    x = tpu(torch.arange(6.0))
    ptr = x.data_ptr()
    x.mul_(2).add_(1)
    assert x.data_ptr() == ptr
    out = torch.empty(6, device="tpu")
    torch.add(x, 1, out=out)
    assert torch.equal(out.cpu(), torch.arange(6.0) * 2 + 2)
    # out= with the wrong size is resized, as on CPU/CUDA
    small = torch.empty(0, device="tpu")
    torch.mul(x, 2, out=small)
    assert small.shape == (6,) and small.device.type == "tpu"
    assert torch.equal(small.cpu(), (torch.arange(6.0) * 2 + 1) * 2)


@pytest.mark.usefixtures("float32_matmuls")  # float32: it checks strides reach the kernel intact
def test_non_contiguous_inputs():
    a = torch.randn(8, 6)
    b = torch.randn(6, 8)
    ta, tb = tpu(a), tpu(b)
    # float32 tolerances: a chip's exp and summation order are its own (the emulator runs CPU's kernels: exact)
    torch.testing.assert_close((ta.t() @ tb.t()).cpu(), a.t() @ b.t())
    torch.testing.assert_close(ta[::2, 1::2].exp().cpu(), a[::2, 1::2].exp())
    torch.testing.assert_close(ta.t().contiguous().cpu(), a.t().contiguous(), rtol=0, atol=0)


def test_data_ptr_unique_and_storage_shared_by_views():
    tensors = [torch.empty(16, device="tpu") for _ in range(8)]
    ptrs = {t.data_ptr() for t in tensors}
    assert len(ptrs) == 8 and 0 not in ptrs
    x = tensors[0]
    assert x[4:].data_ptr() == x.data_ptr() + 4 * 4
    assert x[4:].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert x.untyped_storage().device.type == "tpu"
    assert x.untyped_storage().nbytes() == 64


def test_copies_between_devices_and_dtypes():
    x = torch.randn(5, 3)
    t = tpu(x)
    u = t.to(torch.bfloat16)
    assert u.device.type == "tpu" and u.dtype == torch.bfloat16
    assert torch.equal(u.cpu(), x.to(torch.bfloat16))
    v = torch.empty(3, 5, device="tpu")
    v.copy_(t.t())
    assert torch.equal(v.cpu(), x.t())
    w = torch.empty(5, 3)
    w.copy_(t)
    assert torch.equal(w, x)
    assert t.clone().data_ptr() != t.data_ptr()


def test_resize_and_set():
    t = torch.empty(0, device="tpu")
    t.resize_(10)
    t.fill_(3.0)
    assert t.shape == (10,) and torch.equal(t.cpu(), torch.full((10,), 3.0))
    s = torch.empty(0, device="tpu")
    s.set_(t.untyped_storage(), 2, (2, 2), (2, 1))
    assert torch.equal(s.cpu(), torch.full((2, 2), 3.0))
    s.fill_(1.0)
    assert t.cpu()[2:6].eq(1.0).all()
    r = torch.empty(0, device="tpu").set_(t)
    assert r.data_ptr() == t.data_ptr()
    storage = t.untyped_storage()
    storage.resize_(80)
    assert storage.nbytes() == 80


def test_item_tolist_nonzero_masked_select():
    x = tpu(torch.tensor([0.0, 1.5, 0.0, -2.0]))
    assert x[1].item() == 1.5
    assert x.tolist() == [0.0, 1.5, 0.0, -2.0]
    assert torch.equal(x.nonzero().cpu(), torch.tensor([[1], [3]]))
    assert torch.equal(torch.masked_select(x, x != 0).cpu(), torch.tensor([1.5, -2.0]))
    assert "tpu:0" in repr(x)


def test_mixed_devices_raise_cuda_error():
    x = tpu(torch.ones(3))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*tpu:0 and cpu"):
        x + torch.ones(3)
    # TorchTPU's own kernels word it their way ("cat(): expected tensor to be on tpu, got cpu"); the emulator's as CUDA
    either = "Expected all tensors to be on the same device|expected tensor to be on tpu, got cpu"
    with pytest.raises(RuntimeError, match=either):
        torch.cat([x, torch.ones(3)])
    with pytest.raises(RuntimeError, match=either):
        torch.mm(tpu(torch.ones(2, 2)), torch.ones(2, 2))


def test_cpu_scalars_and_cpu_indices_are_allowed():
    x = tpu(torch.arange(5.0))
    y = x * torch.tensor(2.0)  # 0-dim CPU tensors act as scalars, as on CUDA
    assert y.device.type == "tpu" and torch.equal(y.cpu(), torch.arange(5.0) * 2)
    idx = torch.tensor([0, 4])
    assert torch.equal(x[idx].cpu(), torch.tensor([0.0, 4.0]))
    x[idx] = 9.0
    assert torch.equal(x.cpu(), torch.tensor([9.0, 1.0, 2.0, 3.0, 9.0]))


def test_integer_histc_like_cuda():
    # transformers' MoE calls histc on integer tensors on any non-CPU device; CUDA supports it.
    x = tpu(torch.tensor([0, 1, 1, 3, 3, 3], dtype=torch.int64))
    h = torch.histc(x, bins=4, min=0, max=3)
    assert h.dtype == torch.int64 and h.device.type == "tpu"
    assert h.cpu().tolist() == [1, 2, 0, 3]


@pytest.mark.emulator_only("the emulator's dispatch: each op runs CPU's own kernel, bit for bit")
@pytest.mark.usefixtures("float32_matmuls")  # exact: the CPU kernel must run, not a composite
def test_composite_ops_match_cpu_bitwise():
    # native_layer_norm / group_norm / addr have CPU and composite kernels; we must run the CPU one.
    x = torch.randn(4, 7, 16)
    ln = torch.nn.LayerNorm(16)
    assert torch.equal(ln.to("tpu")(tpu(x)).cpu(), ln.cpu()(x))
    gn = torch.nn.GroupNorm(2, 4)
    y = torch.randn(2, 4, 5, 5)
    assert torch.equal(gn.to("tpu")(tpu(y)).cpu(), gn.cpu()(y))
    conv = torch.nn.Conv2d(4, 3, 3)
    assert torch.equal(conv.to("tpu")(tpu(y)).cpu(), conv.cpu()(y))


def test_sdpa_takes_the_fused_path_in_bfloat16():
    # The backend choice must not silently take the math path (a dispatch stub, not the dispatcher):
    # the fused kernel is what computes in bfloat16 (gap attention_precision), so bf16 error shows it ran.
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (torch.randn(2, 4, 9, 16) for _ in range(3))
    kv = torch.randn(2, 2, 9, 16)
    for args, kwargs in (((q, k, v), {"is_causal": True}), ((q, kv, kv), {"enable_gqa": True})):
        expected = sdpa(*args, **kwargs)
        actual = sdpa(*(tpu(t) for t in args), **kwargs).cpu()
        torch.testing.assert_close(actual, expected, rtol=1.6e-2, atol=1e-2)  # bfloat16
        assert (actual - expected).abs().max() > 1e-5  # not float32: the fused kernel, in bfloat16
        torch.testing.assert_close(actual, sdpa(*(t.bfloat16() for t in args), **kwargs).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.usefixtures("float32_matmuls")  # float32: gradients through the device equal CPU's
def test_autograd_through_device():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(4, 5)
    (x @ w).tanh().sum().backward()
    wt = w.detach().to("tpu").requires_grad_()
    (tpu(x) @ wt).tanh().sum().backward()
    assert wt.grad.device.type == "tpu"
    torch.testing.assert_close(wt.grad.cpu(), w.grad)


def test_autocast_defaults_to_bf16():
    a, b = tpu(torch.randn(4, 4)), tpu(torch.randn(4, 4))
    with without("autocast_defaults_to_bfloat16", "autocast_default_float16") as gap:
        if gap:  # TorchTPU leaves torch's autocast dtype for the device at its float16 default
            with torch.autocast("tpu"):
                assert (a @ b).dtype == torch.float16
    with torch.autocast("tpu"):
        c = a @ b
    assert c.dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        assert (a @ b).dtype == torch.float16


def test_zero_gradients():
    x = torch.randn(4, 4).to("tpu").requires_grad_()
    (g,) = torch.autograd.grad(torch.sgn(x), [x], torch.ones(4, 4, device="tpu"))
    assert g.device.type == "tpu"
    assert torch.equal(g.cpu(), torch.zeros(4, 4))
    assert torch.equal((g + 1).cpu(), torch.ones(4, 4))


@pytest.mark.emulator_only("the emulator runs CPU's autograd formulas, which return zero tensors; TorchTPU's do not")
def test_efficient_zero_gradients():
    # Autograd returns storage-less "zero tensors" for gradients known to be zero (sgn, ...).
    x = torch.randn(4, 4).to("tpu").requires_grad_()
    (g,) = torch.autograd.grad(torch.sgn(x), [x], torch.ones(4, 4, device="tpu"))
    assert g._is_zerotensor() and g.device.type == "tpu"
    assert torch.equal(g.cpu(), torch.zeros(4, 4))
    assert torch.equal((g + 1).cpu(), torch.ones(4, 4))


def _dispatched_ops(device: str) -> list[str]:
    """The aten ops one small decode-like sequence dispatches on ``device``, in order."""
    a = torch.randn(2, 8, device=device)
    b = torch.randn(2, 8, device=device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a + b
        a * b
        a * 0.5
        torch.rsqrt(a.abs())
        a.pow(2).mean(-1, keepdim=True)
        torch.nn.functional.silu(a)
        torch.cat([a, b], -1)
        a.add_(b)
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


@pytest.mark.emulator_only("the emulator's dispatch: which aten ops a sequence reaches")
def test_structured_ops_dispatch_like_cpu():
    """add, mul, pow, mean, ... dispatch exactly the ops they dispatch on CPU: their CPU kernel, once.

    Their CompositeExplicitAutogradNonFunctional kernel, which wins over a backend fallback, would instead
    allocate the output through the dispatcher (aten::empty) and call the out= op: three dispatches and two
    TensorIterators per op, the emulator's largest per-op cost in eager decoding before it was routed.
    """
    assert _dispatched_ops("tpu") == _dispatched_ops("cpu")


def _unboxed_cases() -> dict[str, object]:
    """One call per op with an unboxed kernel, on inputs that exercise the fallback's rules: views with odd
    strides, broadcasting, 0-dim CPU scalars, type promotion, in place."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    y = torch.randn(6, 4, generator=g).t()  # non-contiguous
    row = torch.randn(6, generator=g)  # broadcast
    scalar = torch.tensor(1.5)  # 0-dim, stays on the CPU
    ints = torch.arange(24).reshape(4, 6)
    mask = x > 0
    idx = torch.tensor([3, 0, 3])

    def inplace(op):
        def run(d):
            target = d(x).clone()
            result = op(target, d)
            assert result is target  # in place: the caller's own tensor comes back
            return target

        return run

    return {
        "add.Tensor": lambda d: torch.add(d(x), d(y), alpha=2),
        "add_.Tensor": inplace(lambda t, d: t.add_(d(row))),
        "add.Scalar": lambda d: torch.ops.aten.add.Scalar(d(x), 3.0, 2),
        "sub.Tensor": lambda d: d(x) - scalar,
        "sub_.Tensor": inplace(lambda t, d: t.sub_(d(y))),
        "mul.Tensor": lambda d: d(ints) * d(x),  # int * float: promotion
        "mul_.Tensor": inplace(lambda t, d: t.mul_(scalar)),
        "mul.Scalar": lambda d: torch.ops.aten.mul.Scalar(d(x), 0.5),
        "mul_.Scalar": inplace(lambda t, d: torch.ops.aten.mul_.Scalar(t, 3)),
        "div.Tensor": lambda d: d(x) / d(row),
        "div_.Tensor": inplace(lambda t, d: t.div_(d(y))),
        "div.Scalar": lambda d: torch.ops.aten.div.Scalar(d(ints), 4),
        "div_.Scalar": inplace(lambda t, d: torch.ops.aten.div_.Scalar(t, 4)),
        "pow.Tensor_Scalar": lambda d: d(y).pow(2),
        "neg": lambda d: -d(y),
        "rsqrt": lambda d: torch.rsqrt(d(x).abs()),
        "exp": lambda d: d(y).exp(),
        "cos": lambda d: d(x).cos(),
        "sin": lambda d: d(y).sin(),
        "tanh": lambda d: d(x).tanh(),
        "sigmoid": lambda d: d(y).sigmoid(),
        "silu": lambda d: torch.nn.functional.silu(d(x)),
        "eq.Scalar": lambda d: d(ints) == 5,
        "eq.Tensor": lambda d: d(ints) == d(ints).flip(0),
        "where.self": lambda d: torch.where(d(mask), d(x), scalar),
        "masked_fill.Scalar": lambda d: d(x).masked_fill(d(mask), -1.0),
        "masked_fill_.Scalar": inplace(lambda t, d: (t[1:3].masked_fill_(d(mask)[1:3], 2.0), t)[1]),  # a view
        "fill_.Scalar": inplace(lambda t, d: t.fill_(7.0)),
        "mean.dim": lambda d: d(y).pow(2).mean(-1, keepdim=True),
        "sum.dim_IntList": lambda d: d(ints).sum(0),  # int64 accumulation
        "_softmax": lambda d: torch.softmax(d(y), -1),
        "cat": lambda d: torch.cat([d(x), d(y), d(x)[:1]], 0),
        "index_select": lambda d: d(x).index_select(0, d(idx)),
        "mm": lambda d: d(x) @ d(y).t(),
        "bmm": lambda d: torch.bmm(d(x)[None], d(y).t()[None]),
        "addmm": lambda d: torch.addmm(d(row[:4]), d(x), d(y).t(), beta=0.5),
        "baddbmm": lambda d: torch.baddbmm(d(x @ y.t())[None], d(x)[None], d(y).t()[None], alpha=2),
    }


@pytest.mark.emulator_only("the emulator core's unboxed kernels")
@pytest.mark.usefixtures("float32_matmuls")  # the matmuls' default precision is test_numerics.py's
def test_unboxed_ops_match_cpu():
    """The ops a decode step runs most have unboxed kernels (hf_tpu/emulator/csrc/aten/unboxed_ops.cpp): each
    gives the CPU's result on the device, for views, broadcasting, CPU scalars, promotion and in place."""
    from hf_tpu.emulator import _build

    cases = _unboxed_cases()
    assert sorted(_build.load().unboxed_ops()) == sorted(cases)  # a new unboxed op needs a case here
    for name, case in cases.items():
        want = case(lambda t: t)
        got = case(tpu)
        assert got.device.type == "tpu", name
        assert got.dtype == want.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got.cpu(), want, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.emulator_only("the emulator core's unboxed kernels")
def test_unboxed_ops_check_devices_like_the_fallback():
    x = tpu(torch.ones(2, 3))
    with pytest.raises(
        RuntimeError, match=r"tpu:0 and cpu! \(when checking argument for argument other in method aten::mul\)"
    ):
        x * torch.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"argument for argument tensors in method aten::cat\)"):
        torch.cat([x, torch.ones(2, 3)])
    with pytest.raises(RuntimeError, match=r"argument for argument mask in method aten::masked_fill_"):
        x.masked_fill_(torch.ones(2, 3, dtype=torch.bool), 0.0)
    assert torch.equal(x.cpu(), torch.ones(2, 3))  # nothing was written
