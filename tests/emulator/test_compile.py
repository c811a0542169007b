"""torch.compile(backend="tpu") on the emulated TPU: TorchTPU's contract, results equal to eager."""

from __future__ import annotations

import pytest
import torch

import hf_tpu
from tests.conftest import run_python

pytestmark = pytest.mark.usefixtures("float32_matmuls")  # the backend contract is checked against CPU in float32


def _f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1) + torch.arange(x.shape[0], device=x.device)


def test_backend_registered_and_matches_eager():
    assert "tpu" in torch._dynamo.list_backends()
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    compiled = torch.compile(_f, backend="tpu")
    out = compiled(x.to("tpu"), w.to("tpu"))
    assert out.device.type == "tpu"
    # Inductor fuses and reorders fp32 math: equal within fp32 rounding, not bitwise.
    torch.testing.assert_close(out.cpu(), _f(x, w), rtol=1e-5, atol=1e-5)


def test_training_step_gradients_match():
    x, w = torch.randn(16, 32), torch.randn(32, 8)
    w_tpu = w.to("tpu").requires_grad_()
    torch.compile(_f, backend="tpu")(x.to("tpu"), w_tpu).sum().backward()
    w_cpu = w.clone().requires_grad_()
    _f(x, w_cpu).sum().backward()
    assert w_tpu.grad.device.type == "tpu"
    torch.testing.assert_close(w_tpu.grad.cpu(), w_cpu.grad, rtol=1e-4, atol=1e-4)


def test_input_mutation_lands_in_device_memory():
    def step(cache, x):
        cache.add_(x)
        return cache * 2

    cache = torch.zeros(4, device="tpu")
    out = torch.compile(step, backend="tpu")(cache, torch.ones(4, device="tpu"))
    assert torch.equal(cache.cpu(), torch.ones(4)) and torch.equal(out.cpu(), torch.full((4,), 2.0))


def test_outputs_that_are_views_of_inputs_share_memory():
    def f(x):
        return x.t(), x[1:] * 1

    x = torch.arange(6.0).reshape(2, 3).to("tpu")
    view, other = torch.compile(f, backend="tpu")(x)
    assert torch.equal(view.cpu(), x.cpu().t())
    x.add_(1)
    assert torch.equal(view.cpu(), x.cpu().t())  # still the same memory
    assert other.data_ptr() != x.data_ptr()


def test_dynamic_true_is_refused():
    with pytest.raises(Exception, match=r"TPU backend does not support torch.compile\(..., dynamic=True"):
        torch.compile(_f, backend="tpu", dynamic=True)(torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu"))


def test_only_options_are_accepted_and_unknown_keys_ignored_as_on_torch_tpu():
    x = torch.randn(4, 4, device="tpu")
    with pytest.raises(Exception, match=r"TypeError: Unexpected keyword arguments: \{'mode': 'max-autotune'\}"):
        torch.compile(_f, backend="tpu", mode="max-autotune")(x, x)
    # TorchTPU ignores an unknown key (gap compile_options_ignored); hf-tpu's workaround names it
    with pytest.warns(UserWarning, match=r"ignores the unknown option\(s\) \['triton.cudagraphs'\]"):
        torch.compile(_f, backend="tpu", options={"triton.cudagraphs": True})(x, x)
    for bad, error in [({"num_dynamic_buckets": 0}, ValueError), ({"bucket_size": 0}, ValueError),
                       ({"debug_callback": 3}, TypeError)]:  # fmt: skip
        torch._dynamo.reset()
        with pytest.raises(Exception, match=f"{error.__name__}: "):  # Dynamo wraps what the backend raised
            torch.compile(_f, backend="tpu", options=bad)(x, x)
    torch.compile(_f, backend="tpu", options={"async_compile": False, "num_dynamic_buckets": None})(x, x)
    torch.compile(_f, backend="tpu", mode="default")(x, x)


def fresh_graph(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # a graph of its own, compiled afresh: no other test compiles it, and AOTAutograd's cache is off around it
    return (x @ w).cos().sum(0) * 3


def test_async_compile_first_call_only_submits_as_on_torch_tpu():
    """options={"async_compile": True}: the first call after a compile raises AsyncCompilationSubmitted (the
    call submitted the compilation and did not run), later calls run."""
    torch._dynamo.reset()
    x = torch.randn(4, 4, device="tpu")
    compiled = torch.compile(_f, backend="tpu", options={"async_compile": True})
    with pytest.raises(Exception) as submitted:  # TorchTPU does not export the class: it is known by its name
        compiled(x, x)
    assert type(submitted.value).__name__ == "AsyncCompilationSubmitted"
    torch.testing.assert_close(compiled(x, x).cpu(), _f(x, x).cpu())


def test_debug_callback_gets_the_graphs():
    torch._dynamo.reset()
    seen = []
    x = torch.randn(4, 4, device="tpu")
    with torch._functorch.config.patch(enable_autograd_cache=False):  # a cached graph skips the forward compile
        torch.compile(fresh_graph, backend="tpu", options={"debug_callback": seen.append})(x, x)
    assert len(seen) == 1 and seen[0].pre_autograd_fx_code and seen[0].post_autograd_fx_forward_code


def test_inductor_with_tpu_inputs_is_refused_and_default_picks_tpu():
    x = torch.randn(4, 4, device="tpu")
    with pytest.raises(Exception, match="backend='inductor'\\) on TPU is experimental"):
        torch.compile(_f, backend="inductor")(x, x)
    torch._dynamo.reset()
    before = torch.tpu._get_cache_stats().num_cache_reqs
    with torch._functorch.config.patch(enable_autograd_cache=False):
        out = torch.compile(fresh_graph)(x, x)  # no backend: tpu inputs select "tpu"
    assert out.device.type == "tpu"
    assert torch.tpu._get_cache_stats().num_cache_reqs > before


def test_cache_stats_count_compilations_and_a_second_compile_reuses_them():
    """TorchTPU's compilation cache: a graph compiles once; Dynamo compiling the same graph again (after a reset)
    compiles nothing new. (How many XLA programs one graph makes is the backend's business: at least one.)"""
    torch._dynamo.reset()

    def g(x):
        return (x.sin() + 1).sum()

    x = torch.randn(8, device="tpu")
    x.cpu()  # eager work done before the count starts
    torch.tpu._clear_cache()
    first = torch.compile(g, backend="tpu")(x).cpu()
    stats = torch.tpu._get_cache_stats()
    compiled = stats.num_compilations
    assert compiled >= 1 and stats.num_cache_reqs >= compiled
    torch._dynamo.reset()
    again = torch.compile(g, backend="tpu")(x).cpu()
    assert torch.tpu._get_cache_stats().num_compilations == compiled
    assert torch.equal(first, again)


def test_recompile_report_counts_and_names_the_change():
    @torch.compile(backend="tpu")
    def f(x, n):
        return x * n

    with hf_tpu.watch_compiles() as report:
        for _ in range(3):
            f(torch.ones(2, 17, device="tpu"), 2)
    assert report.count() == 1 and report.recompiles == []
    with hf_tpu.watch_compiles() as report:
        f(torch.ones(2, 23, device="tpu"), 2)
        f(torch.ones(2, 23, device="tpu"), 2)
    assert len(report.recompiles) == 1
    assert report.recompiles[0].reason == "input 'x' dim 1 changed 17 → 23"
    assert "dim 1 changed 17 → 23" in str(report)
    with hf_tpu.watch_compiles() as report:
        f(torch.ones(2, 23, device="tpu", dtype=torch.bfloat16), 2)
    assert report.recompiles[0].reason == "input 'x' dtype changed Float → BFloat16"
    assert any(c.function == "f" for c in hf_tpu.compile_report().compiles)


def test_a_view_at_a_new_storage_offset_recompiles_as_on_tpu():
    # TorchTPU guards input storage offsets: `for t in timesteps` hands a new view every step.
    @torch.compile(backend="tpu", fullgraph=True)
    def f(x, t):
        return x * t

    x, timesteps = torch.ones(2, device="tpu"), torch.linspace(1, 0, 3, device="tpu")
    with hf_tpu.watch_compiles() as report:
        for t in timesteps:
            torch.testing.assert_close(f(x, t).cpu(), x.cpu() * t.item())
    assert report.count() == 3
    assert report.recompiles[0].reason.startswith("input 't' storage offset changed (it was 0)")
    with hf_tpu.watch_compiles() as report:
        for t in timesteps:
            f(x, t.clone())  # offset 0 again: the first graph serves every step
    assert report.count() == 0


def test_strict_mode_raises_on_recompile_after_warm_up():
    @torch.compile(backend="tpu")
    def h(x):
        return x + 1

    with pytest.raises(hf_tpu.RecompileError, match=r"input 'x' dim 0 changed 3 → 4"):
        with hf_tpu.strict_recompile() as report:
            h(torch.ones(3, device="tpu"))  # warm-up compile is allowed
            h(torch.ones(3, device="tpu"))
            warmed_up = True
            h(torch.ones(4, device="tpu"))
    assert warmed_up and report.count() == 1
    h(torch.ones(5, device="tpu"))  # outside the block recompiles are allowed again


def test_strict_mode_from_environment():
    code = """
        import torch, hf_tpu
        f = torch.compile(lambda x: x * 2, backend="tpu")
        f(torch.ones(2, device="tpu"))
        try:
            f(torch.ones(3, device="tpu"))
        except Exception as err:
            dynamo = isinstance(err, torch._dynamo.exc.TorchDynamoException)
            print("RAISED", isinstance(err, hf_tpu.RecompileError), dynamo, " ".join(str(err).split()))
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_STRICT_RECOMPILE": "1"})
    # hf-tpu's error, with what changed and what to do, as strict_recompile() gives; still Dynamo's type.
    assert "RAISED True True hf-tpu strict recompile: recompiling <lambda>" in proc.stdout, proc.stdout + proc.stderr
    assert "pad inputs to fixed sizes" in proc.stdout


@pytest.mark.emulator_only("HF_TPU_COMPILE_FALLBACK is the emulator's: how it compiles graphs without a C++ compiler")
def test_aot_eager_fallback_without_a_cxx_compiler():
    code = """
        import torch
        torch.set_float32_matmul_precision("highest")
        f = torch.compile(lambda x, w: torch.relu(x @ w).sum(), backend="tpu")
        x, w = torch.randn(4, 8), torch.randn(8, 3)
        out = f(x.to("tpu"), w.to("tpu"))
        print("EQUAL", out.device, torch.allclose(out.cpu(), torch.relu(x @ w).sum()))
        entries = torch.tpu._get_cache_stats().per_entry_stats  # the graphs (eager ops count as compilations too)
        print("COMPILED", sum(e["compilation_duration"] > 0 for e in entries))
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1", "HF_TPU_COMPILE_FALLBACK": "aot_eager"})
    assert "EQUAL tpu:0 True" in proc.stdout, proc.stderr[-2000:]
    assert "COMPILED 0" in proc.stdout
