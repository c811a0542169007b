"""``torch.ops.tpu.*`` with TorchTPU 0.2.0's schemas, and ``torch.tpu.ops``, the public functions over them.

The operators take TorchTPU's exact schemas (the contract test compares them with the wheel's) and have kernels
for the "tpu" device and fake tensors only, as on TorchTPU (a CPU tensor is refused by the dispatcher). Each
kernel is a reference implementation with torch ops on the device, so the emulator's TPU numerics apply inside.
SparseCore embedding ops and the dynamic-shape compiler's internal ops have no CPU semantics documented well
enough to emulate: calling one raises NotImplementedError naming it (their schemas still match).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hf_tpu.emulator.api_stage import warn_experimental

SCHEMAS = {
    "_all_gather_dim": "(Tensor input, int dim, int group_size, str group_name) -> Tensor",
    "_dynamic_arange": "(Tensor start, Tensor end, Tensor step, int max_length, ScalarType dtype) -> Tensor",
    "_dynamic_broadcast": "(Tensor input, Tensor[] shape, int[] broadcast_dims, int[] static_shape, bool[] is_dynamic) -> Tensor",
    "_dynamic_reshape": "(Tensor input, Tensor[] shape, int[] static_shape, bool[] is_dynamic) -> Tensor",
    "_dynamic_slice": "(Tensor input, Tensor[] start_indices, int[] slice_sizes) -> Tensor",
    "_max_pool1d": "(Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_max_pool1d_backward": "(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_max_pool2d": "(Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_max_pool2d_backward": "(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_max_pool3d": "(Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_max_pool3d_backward": "(Tensor grad_output, Tensor self, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    "_optimization_barrier": "(Tensor[] inputs) -> Tensor[]",
    "_pad_real_to_static": "(Tensor input, Tensor[] runtime_shape, int[] static_shape, bool[] is_dynamic) -> Tensor",
    "_ragged_all_to_all": "(Tensor operand, Tensor output, Tensor input_offsets, Tensor send_sizes, Tensor output_offsets, Tensor recv_sizes, str process_group_name) -> Tensor",
    "_ragged_all_to_all.out": "(Tensor operand, Tensor output, Tensor input_offsets, Tensor send_sizes, Tensor output_offsets, Tensor recv_sizes, str process_group_name, *, Tensor(a!) out) -> Tensor(a!)",
    "_ragged_dot": "(Tensor lhs, Tensor rhs, Tensor group_sizes) -> Tensor",
    "_ragged_dot.out": "(Tensor lhs, Tensor rhs, Tensor group_sizes, *, Tensor(a!) out) -> Tensor(a!)",
    "_ragged_dot_weight_grad": "(Tensor lhs, Tensor grad_output, Tensor group_sizes) -> Tensor",
    "_recv": "(Tensor[] tensors, int src, int tag) -> Any",
    "_reduce_scatter_dim": "(Tensor input, str reduce_op, int dim, int group_size, str group_name) -> Tensor",
    "_send": "(Tensor[] tensors, int dst, int tag) -> Any",
    "_set_dimension_logical_size": "(Tensor input, int dim, Tensor size) -> Tensor",
    "_sparse_dense_matmul": "(Tensor row_pointers, Tensor embedding_ids, Tensor sample_ids, Tensor gains, Tensor embedding_table, int device_batch_size, int max_ids_per_partition, int max_unique_ids_per_partition) -> Tensor",
    "_sparse_dense_matmul_activation_unstack": "(Tensor stacked_activations, int[] per_feature_batch_sizes, int[] per_feature_dims) -> Tensor[]",
    "_sparse_dense_matmul_grad_with_adagrad": "(Tensor row_pointers, Tensor embedding_ids, Tensor sample_ids, Tensor gains, Tensor embedding_table, Tensor accumulator, Tensor activations_grad, Tensor learning_rate, float epsilon, int device_batch_size, int max_ids_per_partition, int max_unique_ids_per_partition, str computation_name) -> (Tensor, Tensor)",
    "_sparse_dense_matmul_grad_with_adam": "(Tensor row_pointers, Tensor embedding_ids, Tensor sample_ids, Tensor gains, Tensor embedding_table, Tensor momentum, Tensor velocity, Tensor activations_grad, Tensor alpha_t, float beta_1, float beta_2, float epsilon, int device_batch_size, int max_ids_per_partition, int max_unique_ids_per_partition, str computation_name) -> (Tensor, Tensor, Tensor)",
    "_sparse_dense_matmul_grad_with_sgd": "(Tensor row_pointers, Tensor embedding_ids, Tensor sample_ids, Tensor gains, Tensor embedding_table, Tensor activations_grad, Tensor learning_rate, int device_batch_size, int max_ids_per_partition, int max_unique_ids_per_partition, str computation_name) -> Tensor",
    "_sparse_dense_matmul_gradient_stack": "(Tensor[] unstacked_gradients, int stacked_batch_size, int stacked_feature_dim) -> Tensor",
    "_sparse_gather": "(Tensor row_pointers, Tensor indices, Tensor operand, int max_non_zeroes_per_row) -> Tensor",
    "_sparse_gather_backward": "(Tensor grad_output, Tensor indices, Tensor grad_operand) -> Tensor",
    "_sparse_iota": "(Tensor row_pointers, int max_non_zeroes, int max_non_zeroes_per_row) -> Tensor",
    "_sparse_map_row": "(Tensor[] csr_tensors, int[] csr_lengths, Tensor[] dense_args, str body_mlir, Tensor[] dummy_outputs, int max_non_zeroes_per_row, int pad_value, int max_pad_per_row, float wait_threshold, int result_row_pointer_op_index) -> Tensor[]",
    "compute_sparse_dense_matmul_stats": "(Tensor input_indices, Tensor input_offsets, int global_device_count, int num_sc_per_device) -> (int, int)",
    "preprocess_sparse_dense_matmul_input": "(Tensor input_indices, Tensor input_offsets, int max_ids_per_partition, int max_unique_ids_per_partition, int suggested_coo_buffer_size, int batch_size, str combiner, int local_device_count, int global_device_count, int num_sc_per_device, bool allow_id_dropping, str table_name) -> Dict(str, Tensor)",
}  # fmt: skip

_library: torch.library.Library | None = None


# ---- reference kernels (tpu tensors in, tpu tensors out) ------------------------------------------
def _offsets(group_sizes: torch.Tensor) -> list[int]:
    sizes = [int(s) for s in group_sizes.cpu().tolist()]
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return starts


def _ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    starts = _offsets(group_sizes)
    out = lhs.new_zeros(lhs.shape[0], rhs.shape[-1])
    for g in range(rhs.shape[0]):
        if starts[g + 1] > starts[g]:
            out[starts[g] : starts[g + 1]] = lhs[starts[g] : starts[g + 1]] @ rhs[g]
    return out


def _ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    starts = _offsets(group_sizes)
    out = lhs.new_zeros(group_sizes.shape[0], lhs.shape[1], grad_output.shape[1])
    for g in range(group_sizes.shape[0]):
        if starts[g + 1] > starts[g]:
            out[g] = lhs[starts[g] : starts[g + 1]].T @ grad_output[starts[g] : starts[g + 1]]
    return out


def _ragged_dot_out(lhs, rhs, group_sizes, *, out):  # noqa: ANN001, ANN202
    return out.copy_(_ragged_dot(lhs, rhs, group_sizes))


_POOLS = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d, 3: torch.nn.functional.max_pool3d}


def _max_pool(dims: int) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    def forward(x, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: ANN001, ANN202
        return _POOLS[dims](x, kernel_size, stride, padding, dilation, ceil_mode)

    def backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: ANN001, ANN202
        with torch.enable_grad():  # the maxima recomputed from the input, as TorchTPU's op does
            leaf = x.detach().requires_grad_(True)
            pooled = _POOLS[dims](leaf, kernel_size, stride, padding, dilation, ceil_mode)
            (grad,) = torch.autograd.grad(pooled, leaf, grad_output)
        return grad

    return forward, backward


def _optimization_barrier(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in inputs]  # an identity (the emulator fuses nothing across it anyway)


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
               "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
               "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}  # fmt: skip


def _group(name: str, size: int) -> dist.ProcessGroup:
    group = dist.distributed_c10d._resolve_process_group(name)
    if group.size() != size:
        raise ValueError(f"process group {name!r} has {group.size()} ranks, not group_size={size}.")
    return group


def _all_gather_dim(x: torch.Tensor, dim: int, group_size: int, group_name: str) -> torch.Tensor:
    group = _group(group_name, group_size)
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] * group_size, *moved.shape[1:]))
    dist.all_gather_into_tensor(out, moved, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter_dim(x: torch.Tensor, reduce_op: str, dim: int, group_size: int, group_name: str) -> torch.Tensor:
    if reduce_op not in _REDUCE_OPS:
        raise ValueError(f"reduce_op must be one of {', '.join(_REDUCE_OPS)}, got {reduce_op!r}.")
    group = _group(group_name, group_size)
    moved = x.movedim(dim, 0).contiguous()
    if moved.shape[0] % group_size:
        raise ValueError(f"input.size({dim}) = {moved.shape[0]} is not divisible by the group size {group_size}.")
    out = moved.new_empty((moved.shape[0] // group_size, *moved.shape[1:]))
    dist.reduce_scatter_tensor(out, moved, op=_REDUCE_OPS[reduce_op], group=group)
    return out.movedim(0, dim).contiguous()


def _ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, process_group_name):  # noqa: ANN001, ANN202
    group = dist.distributed_c10d._resolve_process_group(process_group_name)
    # Each receiver needs the offset its sender chose for it: exchange the offsets first.
    where = torch.empty_like(output_offsets)
    dist.all_to_all_single(where, output_offsets.contiguous(), group=group)
    starts, sends = input_offsets.cpu().tolist(), send_sizes.cpu().tolist()
    receives, at = recv_sizes.cpu().tolist(), where.cpu().tolist()
    outgoing = [operand[s : s + n].contiguous() for s, n in zip(starts, sends, strict=True)]
    incoming = [operand.new_empty((n, *operand.shape[1:])) for n in receives]
    dist.all_to_all(incoming, outgoing, group=group)
    result = output.clone()
    for chunk, start in zip(incoming, at, strict=True):
        result[start : start + chunk.shape[0]] = chunk
    return result


def _ragged_all_to_all_out(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,  # noqa: ANN001, ANN202
                           process_group_name, *, out):  # fmt: skip
    result = _ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                                process_group_name)  # fmt: skip
    return out.copy_(result)


def _send(tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
    return dist.isend(tensors[0], dst, tag=tag) if len(tensors) == 1 else dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, t, dst, tag=tag) for t in tensors])[-1]  # fmt: skip


def _recv(tensors: list[torch.Tensor], src: int, tag: int) -> Any:
    return dist.irecv(tensors[0], src, tag=tag) if len(tensors) == 1 else dist.batch_isend_irecv(
        [dist.P2POp(dist.irecv, t, src, tag=tag) for t in tensors])[-1]  # fmt: skip


def _not_emulated(name: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        kind = "SparseCore embedding" if "sparse" in name else "dynamic-shape compiler (internal)"
        raise NotImplementedError(
            f"torch.ops.tpu.{name} (a TorchTPU {kind} op) is not emulated: it runs on the chip only. Its schema "
            "matches TorchTPU's, so code that refers to it imports and traces; run it on a TPU."
        )

    return kernel


def _kernels() -> dict[str, Callable[..., Any]]:
    kernels: dict[str, Callable[..., Any]] = {
        "_ragged_dot": _ragged_dot,
        "_ragged_dot.out": _ragged_dot_out,
        "_ragged_dot_weight_grad": _ragged_dot_weight_grad,
        "_optimization_barrier": _optimization_barrier,
        "_all_gather_dim": _all_gather_dim,
        "_reduce_scatter_dim": _reduce_scatter_dim,
        "_ragged_all_to_all": _ragged_all_to_all,
        "_ragged_all_to_all.out": _ragged_all_to_all_out,
        "_send": _send,
        "_recv": _recv,
    }
    for dims in (1, 2, 3):
        kernels[f"_max_pool{dims}d"], kernels[f"_max_pool{dims}d_backward"] = _max_pool(dims)
    return kernels


def _ragged_dot_fake(lhs, rhs, group_sizes):  # noqa: ANN001, ANN202
    return lhs.new_empty(lhs.shape[0], rhs.shape[-1])


def _ragged_dot_setup(ctx, inputs, output):  # noqa: ANN001, ANN202
    ctx.save_for_backward(*inputs)


def _ragged_dot_backward(ctx, grad):  # noqa: ANN001, ANN202
    lhs, rhs, group_sizes = ctx.saved_tensors
    grad_lhs = torch.ops.tpu._ragged_dot(grad, rhs.transpose(1, 2), group_sizes)
    return grad_lhs, torch.ops.tpu._ragged_dot_weight_grad(lhs, grad, group_sizes), None


def register() -> None:
    """Define the ``tpu`` operators (once per process) with tpu kernels and fake-tensor shapes."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("tpu", "FRAGMENT")
    kernels = _kernels()
    for name, schema in SCHEMAS.items():
        lib.define(name + schema)
        lib.impl(name, kernels.get(name, _not_emulated(name)), "PrivateUse1")
    torch.library.register_fake("tpu::_ragged_dot", _ragged_dot_fake, lib=lib)
    torch.library.register_fake(
        "tpu::_ragged_dot_weight_grad",
        lambda lhs, g, sizes: lhs.new_empty(sizes.shape[0], lhs.shape[1], g.shape[1]),
        lib=lib,
    )
    torch.library.register_fake("tpu::_optimization_barrier", lambda xs: [x.clone() for x in xs], lib=lib)
    torch.library.register_autograd("tpu::_ragged_dot", _ragged_dot_backward, setup_context=_ragged_dot_setup, lib=lib)
    _library = lib


# ---- torch.tpu.ops ---------------------------------------------------------------------------------
def _experimental(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        warn_experimental(f"ops.{name}", depth=1)
        return fn(*args, **kwargs)

    return wrapper


def _resolve_group(group: dist.ProcessGroup | None) -> tuple[int, str]:
    group = dist.group.WORLD if group is None else group
    if group is None:
        raise ValueError("Default process group has not been initialized, please make sure to call init_process_group.")
    return group.size(), group.group_name


def optimization_barrier(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """An identity the XLA compiler does not move computation across (the emulator fuses nothing anyway)."""
    return torch.ops.tpu._optimization_barrier(inputs)


def _pool_functions(dims: int) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    op = getattr(torch.ops.tpu, f"_max_pool{dims}d")
    backward_op = getattr(torch.ops.tpu, f"_max_pool{dims}d_backward")

    def max_pool(input, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: A002, ANN001, ANN202
        return op(input, kernel_size, stride, padding, dilation, ceil_mode)

    def max_pool_backward(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode):  # noqa: A002, ANN001, ANN202
        return backward_op(grad_output, input, kernel_size, stride, padding, dilation, ceil_mode)

    max_pool.__name__ = max_pool.__qualname__ = f"max_pool{dims}d"
    max_pool.__doc__ = f"{dims}D max pooling without indices (not differentiable: see max_pool{dims}d_backward)."
    max_pool_backward.__name__ = max_pool_backward.__qualname__ = f"max_pool{dims}d_backward"
    max_pool_backward.__doc__ = f"The gradient of max_pool{dims}d, the maxima recomputed from ``input``."
    return max_pool, max_pool_backward


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *, out: torch.Tensor | None = None):  # noqa: ANN201
    """``result[start_i:end_i] = lhs[start_i:end_i] @ rhs[i]`` over consecutive row groups (MoE experts)."""
    if out is None:
        return torch.ops.tpu._ragged_dot(lhs, rhs, group_sizes)
    return torch.ops.tpu._ragged_dot.out(lhs, rhs, group_sizes, out=out)


def ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The gradient of ragged_dot with respect to ``rhs``: ``lhs[group].T @ grad_output[group]`` per group."""
    return torch.ops.tpu._ragged_dot_weight_grad(lhs, grad_output, group_sizes)


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, process_group_name,  # noqa: ANN001, ANN201
                      *, out=None):  # fmt: skip
    """Send ``operand[input_offsets[j]:][:send_sizes[j]]`` to rank j, written there at ``output_offsets[j]``."""
    args = (operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, process_group_name)
    return (
        torch.ops.tpu._ragged_all_to_all(*args) if out is None else torch.ops.tpu._ragged_all_to_all.out(*args, out=out)
    )


def send(tensors: Sequence[torch.Tensor], dst: int, tag: int) -> Any:
    """Send ``tensors`` to rank ``dst`` of the default process group; returns the Work to wait on."""
    return torch.ops.tpu._send(tensors, dst, tag)


def recv(tensors: Sequence[torch.Tensor], src: int, tag: int) -> Any:
    """Receive into ``tensors`` from rank ``src``; returns the Work to wait on before reading them."""
    return torch.ops.tpu._recv(tensors, src, tag)


def all_gather_dim(input: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:  # noqa: A002
    """All-gather ``input`` from every rank, concatenated along ``dim`` (no autograd, as on TorchTPU)."""
    group_size, group_name = _resolve_group(group)
    return torch.ops.tpu._all_gather_dim(input, dim, group_size, group_name)


def reduce_scatter_dim(input: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None,  # noqa: A002
                       reduce_op: str = "sum") -> torch.Tensor:  # fmt: skip
    """Reduce ``input`` over the ranks and return this rank's chunk along ``dim``."""
    group_size, group_name = _resolve_group(group)
    return torch.ops.tpu._reduce_scatter_dim(input, reduce_op, dim, group_size, group_name)


def align_jagged_to_multiple(nt: torch.Tensor, multiple: int = 128, padding_value: float | int | bool = 0.0):  # noqa: ANN201
    """Pad a jagged NestedTensor's values buffer to a multiple of ``multiple`` rows (offsets unchanged)."""
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets

    values = nt.values()
    short = -values.shape[0] % multiple
    if short == 0:
        return nt
    padding = values.new_full((short, *values.shape[1:]), padding_value)
    return nested_view_from_values_offsets(torch.cat([values, padding]), nt.offsets())


def strip_jagged_padding(nt: torch.Tensor, valid_tokens: int | None = None):  # noqa: ANN201
    """Drop the values buffer's rows past the last offset (``valid_tokens`` avoids reading it from the chip)."""
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets

    offsets = nt.offsets()
    if valid_tokens is None:
        valid_tokens = int(offsets[-1]) if offsets.numel() else 0
    if nt.values().shape[0] == valid_tokens:
        return nt
    return nested_view_from_values_offsets(nt.values()[:valid_tokens], offsets)


def splash_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    is_causal: bool = True,
    local_window_size: int | None = None,
    enable_gqa: bool = False,
    block_q: int = 512,
    block_kv: int = 512,
    block_dkv: int = 512,
    block_kv_compute: int = 512,
    block_q_dkv: int = 512,
    block_kv_dkv: int = 512,
    block_kv_dkv_compute: int = 512,
    block_q_dq: int | None = None,
    block_kv_dq: int | None = None,
    use_fused_bwd_kernel: bool = True,
    use_vmap_bwd: bool = True,
    q_layout: str = "HEAD_DIM_MINOR",
    k_layout: str = "HEAD_DIM_MINOR",
    v_layout: str = "HEAD_DIM_MINOR",
) -> torch.Tensor:
    """Attention like ``F.scaled_dot_product_attention`` ([batch, heads, length, head_dim]), causal by default,
    with an optional sliding window of ``local_window_size`` keys. TorchTPU runs JAX's splash-attention Pallas
    kernel (the block sizes and layouts tune it); the emulator computes the same masked attention with SDPA,
    so the block and layout arguments change nothing here. Differentiable in q, k and v."""
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if enable_gqa != (n_heads != n_kv_heads):
        raise ValueError(f"enable_gqa ({enable_gqa}) does not match inputs: n_heads={n_heads}, n_kv_heads={n_kv_heads}")
    q_len, kv_len = q.shape[-2], k.shape[-2]
    kv_compute = min(block_kv_compute, kv_len)  # JAX's splash kernel tiles keys in lanes of 128
    if kv_compute % 128:
        raise ValueError(f"bkv_compute={kv_compute} must be a multiple of 128.")
    mask = None
    if is_causal or local_window_size is not None:
        rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
        cols = torch.arange(kv_len, device=q.device)[None, :]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
        if is_causal:
            mask &= cols <= rows
        if local_window_size is not None:
            mask &= (rows - cols).abs() < local_window_size if not is_causal else rows - cols < local_window_size
    gqa = k.shape[-3] != q.shape[-3]
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


_SPARSE = {
    "sparse_dense_matmul": "row_pointers, embedding_ids, sample_ids, gains, embedding_table, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition",
    "sparse_dense_matmul_grad_with_sgd": "row_pointers, embedding_ids, sample_ids, gains, embedding_table, activations_grad, learning_rate, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name",
    "sparse_dense_matmul_grad_with_adagrad": "row_pointers, embedding_ids, sample_ids, gains, embedding_table, accumulator, activations_grad, learning_rate, epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name",
    "sparse_dense_matmul_grad_with_adam": "row_pointers, embedding_ids, sample_ids, gains, embedding_table, momentum, velocity, activations_grad, alpha_t, beta_1, beta_2, epsilon, device_batch_size, max_ids_per_partition, max_unique_ids_per_partition, computation_name",
    "sparse_dense_matmul_activation_unstack": "stacked_activations, per_feature_batch_sizes, per_feature_dims",
    "sparse_dense_matmul_gradient_stack": "unstacked_gradients, stacked_batch_size, stacked_feature_dim",
    "sparse_gather": "row_pointers, indices, operand, max_non_zeroes_per_row",
    "sparse_gather_backward": "grad_output, indices, grad_operand",
    "sparse_iota": "row_pointers, max_non_zeroes, max_non_zeroes_per_row",
    "sparse_map_row": "csr_tensors, csr_lengths, dense_args, body_mlir, dummy_outputs, max_non_zeroes_per_row, pad_value, max_pad_per_row, wait_threshold, result_row_pointer_op_index",
}  # fmt: skip


def _sparse_function(name: str, params: str) -> Callable[..., Any]:
    """A function with TorchTPU's parameters that calls its (not emulated) SparseCore operator."""
    names = [p.strip() for p in params.split(",")]
    op = getattr(torch.ops.tpu, "_" + name)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = call.__signature__.bind(*args, **kwargs)  # type: ignore[attr-defined]
        return op(*bound.args)

    import inspect

    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    )
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"TorchTPU's SparseCore op {name} (runs on a chip only; the emulator raises NotImplementedError)."
    return call


def build_module() -> types.ModuleType:
    """``torch.tpu.ops``: TorchTPU's 28 public functions (its stable max-pool ops warn nothing; the rest are
    experimental and warn once, as on TorchTPU)."""
    register()
    mod = types.ModuleType("torch.tpu.ops", "Public custom ops API for TorchTPU (`torch.tpu.ops`), emulated.")
    functions: dict[str, Callable[..., Any]] = {}
    for dims in (1, 2, 3):
        functions[f"max_pool{dims}d"], functions[f"max_pool{dims}d_backward"] = _pool_functions(dims)
    experimental_functions = [optimization_barrier, ragged_dot, ragged_dot_weight_grad, ragged_all_to_all, send,
                              recv, all_gather_dim, reduce_scatter_dim, align_jagged_to_multiple,
                              strip_jagged_padding, splash_sdpa]  # fmt: skip
    experimental_functions += [_sparse_function(name, params) for name, params in _SPARSE.items()]
    for fn in experimental_functions:
        functions[fn.__name__] = _experimental(fn.__name__, fn)
    for name, fn in functions.items():
        setattr(mod, name, fn)
    mod.__all__ = sorted(functions)
    return mod
