"""Run PyTorch's OpInfo database on the emulated TPU and on CPU, and compare.

Every sample of every OpInfo, in float32 and bfloat16 where the op supports the dtype,
runs forward on ``"tpu"`` and on CPU from the same seed (the emulated device's generator
draws from the same engine as the CPU's, so random ops must agree too); where the op
supports autograd, gradients for one fixed cotangent are compared as well.

The sweep checks that every op reaches its CPU kernel with its arguments intact, so it runs at float32
matmul precision ("highest"): at TorchTPU's default, matmul-class ops round their operands to bfloat16
by design (tests/emulator/test_numerics.py checks that). Ops that hf-tpu works around on TPU (cholesky,
ctc_loss, multinomial...) run through their workarounds, as users get them.

Results are keyed ``"<op name>[.<variant>]|<dtype>"``. A sample that fails on CPU is not a device
question: it is counted apart (``cpu_failed``), never as a pass. An OpInfo whose ``sample_inputs``
raises is a result too (``sample_error``), so no op disappears from the sweep.
``python tests/emulator/opinfo_sweep.py [op ...]`` prints the summary and the failing keys with their
failing-sample counts and first error (to update the expected failures file by hand, each with a reason).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_map

DTYPES = (torch.float32, torch.bfloat16)
# Ops whose outputs are uninitialised memory: compare shape, dtype and device only.
UNINITIALISED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
# Tolerances: the same CPU kernels run underneath, so agreement is expected to be (near) exact;
# these are the slack for kernels whose reduction order depends on memory alignment.
TOLERANCES = {torch.float32: (1e-5, 1.3e-6), torch.bfloat16: (1e-2, 1.6e-2)}


@dataclass
class OpResult:
    key: str
    passed: int = 0
    failed: int = 0
    cpu_failed: int = 0  # samples that fail on CPU too: neither passed nor failed
    sample_error: str = ""  # sample_inputs itself raised
    first_error: str = ""
    errors: list[str] = field(default_factory=list)


def _key(op, dtype: torch.dtype) -> str:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    return f"{name}|{str(dtype).removeprefix('torch.')}"


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        if x.requires_grad:
            t.requires_grad_(True)
        return t
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("tpu")
    return x


def _tpu_kwargs(kwargs: dict) -> dict:
    out = tree_map(_to_tpu, kwargs)
    if out.get("device") in ("cpu", torch.device("cpu")):
        out["device"] = "tpu"
    return out


def _differentiable(outputs) -> list[torch.Tensor]:
    flat, _ = tree_flatten(outputs)
    return [o for o in flat if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point()]


def _grads(outputs, inputs, seed: int) -> list[torch.Tensor | None]:
    outs = _differentiable(outputs)
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outs or not leaves:
        return []
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    return list(torch.autograd.grad(outs, leaves, cotangents, allow_unused=True))


def _device_expected(args, kwargs) -> str:
    """Where outputs belong: "tpu" if the op got a tpu tensor or device and no explicit CPU device."""
    flat = tree_flatten((args, kwargs))[0]
    if any(x in ("cpu", torch.device("cpu")) for x in flat if isinstance(x, str | torch.device)):
        return "any"  # e.g. x.to("cpu"): the op itself asks for CPU
    if any(isinstance(x, torch.Tensor) and x.device.type == "tpu" for x in flat) or kwargs.get("device") == "tpu":
        return "tpu"
    return "any"  # a factory with no device argument makes CPU tensors, on TorchTPU too


def _compare(actual, expected, dtype: torch.dtype, shape_only: bool, device: str = "tpu") -> None:
    a_flat, _ = tree_flatten(actual)
    e_flat, _ = tree_flatten(expected)
    if len(a_flat) != len(e_flat):
        raise AssertionError(f"{len(a_flat)} outputs on tpu, {len(e_flat)} on cpu")
    atol, rtol = TOLERANCES[dtype]
    for a, e in zip(a_flat, e_flat, strict=True):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"tpu gave {type(a).__name__}, cpu gave a tensor")
            if device == "tpu" and a.device.type != "tpu":
                raise AssertionError(f"output on {a.device}, expected tpu")
            a = a.cpu()
            if shape_only:
                assert a.shape == e.shape and a.dtype == e.dtype, f"{a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
            else:
                torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)
        elif isinstance(e, float | int | bool | complex) and not isinstance(e, bool):
            torch.testing.assert_close(a, e, atol=atol, rtol=rtol, equal_nan=True)


CPU_FAILED = "cpu failed"


def run_sample(op, sample, dtype: torch.dtype, seed: int) -> str | None:
    """None if tpu agrees with cpu, :data:`CPU_FAILED` if cpu itself fails, else a one-line error."""
    shape_only = op.name in UNINITIALISED
    args_cpu = (sample.input, *sample.args)
    try:
        torch.manual_seed(seed)
        expected = op(sample.input, *sample.args, **sample.kwargs)
        expected_grads = _grads(expected, tree_flatten(args_cpu)[0], seed) if op.supports_autograd else []
    except Exception:
        return CPU_FAILED  # the sample is invalid on CPU too: not a device question
    try:
        args_tpu = tree_map(_to_tpu, args_cpu)
        kwargs_tpu = _tpu_kwargs(sample.kwargs)
        torch.manual_seed(seed)
        actual = op(*args_tpu, **kwargs_tpu)
        _compare(actual, expected, dtype, shape_only, _device_expected(args_tpu, kwargs_tpu))
        if expected_grads:
            actual_grads = _grads(actual, tree_flatten(args_tpu)[0], seed)
            _compare(actual_grads, expected_grads, dtype, shape_only)
    except Exception as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    return None


def sweep(ops: Iterable | None = None, progress: bool = False) -> list[OpResult]:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return _sweep(ops, progress)
    finally:
        torch.set_float32_matmul_precision(previous)


def _sweep(ops: Iterable | None, progress: bool) -> list[OpResult]:
    from torch.testing._internal.common_methods_invocations import op_db

    results = []
    for op in ops if ops is not None else op_db:
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            if progress:
                print(_key(op, dtype), file=sys.stderr, flush=True)
            results.append(sweep_one(op, dtype))
    return results


def sweep_one(op, dtype: torch.dtype) -> OpResult:
    """Every sample of one OpInfo at one dtype (at the caller's matmul precision)."""
    result = OpResult(_key(op, dtype))
    requires_grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")
    try:
        torch.manual_seed(0)
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=requires_grad))
    except Exception as err:
        result.sample_error = f"sample_inputs raised {type(err).__name__}: {str(err).splitlines()[0]}"[:300]
        result.first_error = result.sample_error
        return result
    for i, sample in enumerate(samples):
        error = run_sample(op, sample, dtype, seed=i)
        if error is None:
            result.passed += 1
        elif error == CPU_FAILED:
            result.cpu_failed += 1
        else:
            result.failed += 1
            result.errors.append(error)
            result.first_error = result.first_error or error
    return result


def main(argv: list[str]) -> None:
    import hf_tpu.emulator

    hf_tpu.emulator.enable()
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [op for op in op_db if not argv or op.name in argv]
    results = sweep(ops, progress=True)
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results)
    cpu_failed = sum(r.cpu_failed for r in results)
    print(
        f"{passed} passed, {failed} failed samples ({100 * passed / max(passed + failed, 1):.2f} %); "
        f"{cpu_failed} fail on CPU too (not counted)"
    )
    for r in results:
        if r.failed or r.sample_error:
            print(f"{r.key} x{r.failed}  # {r.failed}/{r.passed + r.failed}: {r.first_error}")


if __name__ == "__main__":
    main(sys.argv[1:])
