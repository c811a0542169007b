"""Workarounds for the TPU backend's own gaps (``hf_tpu.gaps``), one small module each.

Each is installed at set-up, on a real or an emulated TPU, only while the backend has the gap: what
``hf-tpu gaps`` last measured on this machine, else the gap table (the emulator: its profile).
``HF_TPU_WORKAROUNDS=0`` turns them all off. They sit in the registry of ``hf_tpu.fixes`` beside the
upstream-library patches; ``hf-tpu gaps`` shows both.
"""

from __future__ import annotations

from types import ModuleType

from hf_tpu import fixes
from hf_tpu.fixes import Fix


def _fix(name: str, gap: str, target: str, module: ModuleType, *, trigger: str | None = None) -> Fix:
    why = (module.__doc__ or "").strip().split("\n")[0].split(": ", 1)[-1]
    return Fix(name, gap, target, why, module.apply, kind="workaround", module=trigger, revert=module.revert)


def _table() -> tuple[Fix, ...]:
    from hf_tpu.workarounds import (
        attention,
        autocast_default,
        autocast_dtype,
        autograd_exit,
        avg_pool1d,
        boolean_mask,
        cholesky,
        compile_options,
        cpu_inputs,
        ctc_loss,
        device_index,
        device_sharing,
        interpolate,
        multinomial,
        record_stream,
        safetensors_device,
        shallow_copy,
        visible_devices,
    )

    def attention_fix(name: str, gap: str, target: str) -> Fix:
        apply, revert = attention.fix(name)
        why = {
            attention.DIFFERENTIABLE_MASK: "a mask that requires grad takes the math path, which differentiates it",
            attention.AT_HIGHEST: "float32 attention at precision 'highest' takes the math path, which honours it",
            attention.FULLY_MASKED_ROWS: "query rows masked everywhere come back as zeros, as on CPU and CUDA",
        }[name]
        return Fix(name, gap, target, why, apply, kind="workaround", revert=revert)

    sdpa = "torch.nn.functional.scaled_dot_product_attention (tpu tensors)"
    return (
        _fix(
            "cholesky_on_cpu",
            "cholesky",
            "aten::linalg_cholesky_ex, cholesky, cholesky_inverse (tpu kernels)",
            cholesky,
        ),
        _fix("ctc_loss_on_cpu", "ctc_loss", "aten::_ctc_loss, aten::_ctc_loss_backward (tpu kernels)", ctc_loss),
        _fix(
            "tpu_cpu_shallow_copy", "weight_tying", "aten::_has_compatible_shallow_copy_type (tpu kernel)", shallow_copy
        ),
        attention_fix(attention.FULLY_MASKED_ROWS, "fully_masked_attention_row", sdpa),
        _fix("seeded_multinomial", "multinomial_seeding", "aten::multinomial (tpu kernel)", multinomial),
        attention_fix(attention.DIFFERENTIABLE_MASK, "differentiable_attention_mask", sdpa),
        _fix(
            "avg_pool1d_through_2d", "avg_pool1d_gradient", "torch.nn.functional.avg_pool1d (tpu tensors)", avg_pool1d
        ),
        _fix(
            "boolean_mask_to_indices", "boolean_mask_indexing", "torch.Tensor.__getitem__ (tpu tensors)", boolean_mask
        ),
        _fix(
            "interpolate_same_size_is_a_copy", "interpolate_same_size", "torch.nn.functional.interpolate", interpolate
        ),
        attention_fix(attention.AT_HIGHEST, "attention_precision", sdpa),
        _fix("int_device_means_that_chip", "device_index", "torch.Tensor.to, torch.nn.Module.to", device_index),
        _fix("visible_devices_warning", "visible_devices", "a warning at set-up", visible_devices),
        _fix("device_sharing_names_the_holder", "device_sharing", "a warning at set-up (real TPU)", device_sharing),
        _fix("record_stream_noop", "record_stream", "aten::record_stream (tpu kernel)", record_stream),
        _fix(
            "autocast_floating_dtypes_only", "autocast_integer_dtype", "torch.autocast (device 'tpu')", autocast_dtype
        ),
        _fix(
            "autocast_defaults_to_bfloat16",
            "autocast_default_float16",
            "torch's autocast dtype for device 'tpu'",
            autocast_default,
        ),
        _fix(
            "autograd_drained_at_exit",
            "autograd_exit_abort",
            "torch.autograd's backward entry point, and an atexit hook",
            autograd_exit,
        ),
        _fix(
            compile_options.NAME,
            "compile_options_ignored",
            "torch.compile(backend='tpu', options=...)",
            compile_options,
        ),
        _fix(
            cpu_inputs.NAME,
            "cpu_tensor_into_compiled_graph",
            "the callable the 'tpu' compile backend returns",
            cpu_inputs,
        ),
        _fix(
            "safetensors_load_to_tpu",
            "safetensors_device",
            "safetensors.safe_open, safetensors.torch.load_file",
            safetensors_device,
            trigger="safetensors.torch",
        ),
    )


_installed = False


def install() -> None:
    """Install the workarounds whose gap this backend has (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    from hf_tpu.gaps.status import present, workarounds_enabled

    table = _table()
    fixes.register(table)
    enabled = workarounds_enabled()
    for fix in table:
        fix = fixes.get(fix.name)
        if not enabled:
            fixes.skip(fix, "HF_TPU_WORKAROUNDS=0")
            continue
        has_gap, why = present(fix.gap)
        if has_gap:
            fix.detail = f"gap present: {why}"
            fixes.install(fix)
        else:
            fixes.skip(fix, why)
