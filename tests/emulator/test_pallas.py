"""torch.tpu.pallas.jax_op on the emulated TPU: JAX on CPU, zero-copy, eager and under torch.compile."""

from __future__ import annotations

import jax  # the test extra has jax: imported, never skipped
import pytest
import torch
from torch.tpu.pallas import jax_op

from tests.conftest import run_python


@jax_op("hf_tpu_test::scaled_gelu")
def scaled_gelu(x: jax.Array, scale: float) -> jax.Array:
    return jax.nn.gelu(x) * scale


@jax_op("hf_tpu_test::ragged_dot")
def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


@jax_op("hf_tpu_test::split_sum")
def split_sum(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x.sum(0), x.sum(1)


def ragged_reference(lhs, rhs, sizes):
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    return torch.cat([lhs[a:b] @ rhs[g] for g, (a, b) in enumerate(zip(starts, starts[1:], strict=False))])


def test_jnp_function_eager():
    x = torch.randn(4, 8)
    y = scaled_gelu(x.to("tpu"), 2.0)
    assert y.device.type == "tpu" and y.shape == (4, 8)
    # jax.nn.gelu is the tanh approximation; float32 on the same CPU: within 1e-6.
    torch.testing.assert_close(y.cpu(), torch.nn.functional.gelu(x, approximate="tanh") * 2, rtol=1e-5, atol=1e-6)


def test_ragged_dot_eager_and_compiled():
    lhs, rhs = torch.randn(10, 4), torch.randn(3, 4, 5)
    sizes = torch.tensor([3, 5, 2], dtype=torch.int32)
    expected = ragged_reference(lhs, rhs, [3, 5, 2])
    out = ragged_dot(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    compiled = torch.compile(lambda a, b, g: ragged_dot(a, b, g).relu(), backend="tpu", fullgraph=True)
    out = compiled(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu"))
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), expected.relu(), rtol=1e-5, atol=1e-5)


def test_tuple_outputs_and_cpu_tensors():
    x = torch.arange(6.0).reshape(2, 3)
    a, b = split_sum(x.to("tpu"))
    assert torch.equal(a.cpu(), x.sum(0)) and torch.equal(b.cpu(), x.sum(1))
    a, b = split_sum(x)  # CPU in, CPU out
    assert a.device.type == "cpu"


def test_signature_checks_like_torchtpu():
    with pytest.raises(ValueError, match="Op name no_namespace does not contain a namespace"):
        jax_op("no_namespace", lambda x: x)
    with pytest.raises(ValueError, match="Missing argument type annotation for JAX function"):

        @jax_op("hf_tpu_test::bad")
        def bad(x, y: jax.Array) -> jax.Array:
            return x

    with pytest.raises(ValueError, match="static_argnames and donate_argnames cannot intersect"):

        @jax_op("hf_tpu_test::bad_donate", donate_argnums=(1,))
        def bad_donate(x: jax.Array, n: int) -> jax.Array:
            return x * n


def test_without_jax_the_error_names_the_extra():
    code = """
        import sys
        sys.modules["jax"] = None  # as if jax were not installed
        import torch
        try:
            torch.tpu.pallas.jax_op("a::b", lambda x: x)
        except ImportError as err:
            print("IMPORT", err)
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1"})
    assert "IMPORT JAX/Pallas is not available" in proc.stdout, proc.stderr[-2000:]
