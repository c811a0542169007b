"""The experts math as JAX functions: each becomes one ``jax_op``, i.e. one compiled op per MoE layer on TPU.

No ``from __future__ import annotations`` here: ``jax_op`` reads the real annotation objects.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "relu": jax.nn.relu,
}


def _dims(transposed: bool) -> jax.lax.RaggedDotDimensionNumbers:
    # HF stores expert weights as [E, out, in]: contract lhs dim 1 with rhs dim 2 (tokamax's TRANS_RHS numbers),
    # so no transposed copy of the weights is made. Transposed models store [E, in, out]: the default numbers.
    return jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([1], [1 if transposed else 2]), ([], [])),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[0],
    )


def ragged_dot_general(
    lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, transposed: bool, impl: str
) -> jax.Array:
    """Rows of ``lhs`` in contiguous groups times ``rhs[group]``. ``impl``: a tokamax implementation name,
    ``"lax"`` (``jax.lax.ragged_dot_general``, what tokamax's ``"xla"`` runs) or ``"grouped"`` (see below)."""
    if impl == "grouped":
        return _grouped_loop(lhs, rhs, group_sizes, transposed)
    dims = _dims(transposed)
    if impl == "lax":  # f32 accumulation, then the input dtype, like tokamax's "xla"
        out = jax.lax.ragged_dot_general(lhs, rhs, group_sizes, dims, preferred_element_type=jnp.float32)
        return out.astype(lhs.dtype)
    import tokamax

    return tokamax.ragged_dot_general(lhs, rhs, group_sizes, dims, implementation=impl)


def _grouped_loop(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, transposed: bool, tile: int = 8) -> jax.Array:
    """The megablox schedule in plain XLA: one small matmul per (group, tile of its rows), in a loop whose trip
    count is the number of non-empty tiles. XLA:CPU lowers ``ragged_dot`` densely (every row times every group,
    G times the work), which hides what a TPU kernel costs; this touches each active expert's weights once."""
    m, k = lhs.shape
    n = rhs.shape[2] if transposed else rhs.shape[1]
    num_groups = rhs.shape[0]
    ends = jnp.cumsum(group_sizes)
    tiles = (group_sizes + tile - 1) // tile
    first_tile = jnp.cumsum(tiles) - tiles
    max_tiles = m // tile + num_groups  # static bound on sum(ceil(size / tile))
    tile_group = jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), tiles, total_repeat_length=max_tiles)
    tile_index = jnp.arange(max_tiles, dtype=jnp.int32) - first_tile[tile_group]
    tile_row = (ends - group_sizes)[tile_group] + tile_index * tile
    padded = jnp.pad(lhs, ((0, tile), (0, 0)))

    def body(i: jax.Array, out: jax.Array) -> jax.Array:
        # Tiles run in row order, so a tile spilling into the next group's rows is overwritten by that group.
        row, w = tile_row[i], rhs[tile_group[i]]
        x = jax.lax.dynamic_slice(padded, (row, 0), (tile, k))
        y = jnp.dot(x, w if transposed else w.T, preferred_element_type=jnp.float32)
        return jax.lax.dynamic_update_slice(out, y.astype(lhs.dtype), (row, 0))

    out = jax.lax.fori_loop(0, tiles.sum(), body, jnp.zeros((m + tile, n), lhs.dtype))
    return jnp.where((jnp.arange(m) < ends[-1])[:, None], out[:m], jnp.zeros((), lhs.dtype))


def _sort(ids: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    flat = ids.reshape(-1).astype(jnp.int32)
    perm = jnp.argsort(flat, stable=True).astype(jnp.int32)
    sorted_ids = flat[perm]
    # Expert-parallel sentinels (id == num_experts) sort last and fall in no group: they cost no compute.
    experts = jnp.arange(num_experts, dtype=jnp.int32)
    group_sizes = (sorted_ids[:, None] == experts[None, :]).sum(0, dtype=jnp.int32)
    return perm, sorted_ids, group_sizes


def _up(hidden, ids, w_up, b_up, transposed, impl):  # noqa: ANN001, ANN202
    num_experts, top_k = w_up.shape[0], ids.shape[1]
    perm, sorted_ids, group_sizes = _sort(ids, num_experts)
    y = ragged_dot_general(hidden[perm // top_k], w_up, group_sizes, transposed, impl)
    if b_up is not None:
        y = y + b_up[jnp.minimum(sorted_ids, num_experts - 1)].astype(y.dtype)
    return y, perm, sorted_ids, group_sizes


def _down(x, weights, perm, sorted_ids, group_sizes, w_down, b_down, transposed, impl, out_dtype):  # noqa: ANN001, ANN202
    num_experts = w_down.shape[0]
    num_tokens, top_k = weights.shape
    out = ragged_dot_general(x, w_down, group_sizes, transposed, impl)
    if b_down is not None:
        out = out + b_down[jnp.minimum(sorted_ids, num_experts - 1)].astype(out.dtype)
    # Rows past sum(group_sizes) are uninitialised in the Pallas kernels: zero them (select, so NaN is dropped too).
    out = jnp.where((sorted_ids < num_experts)[:, None], out, jnp.zeros((), out.dtype))
    out = out * weights.reshape(-1)[perm][:, None]
    # Un-sort with a gather (argsort of the permutation), not a scatter-add; sum over top_k in f32.
    out = out[jnp.argsort(perm)].astype(jnp.float32).reshape(num_tokens, top_k, -1).sum(1)
    return out.astype(out_dtype)


def experts(
    hidden: jax.Array,
    ids: jax.Array,
    weights: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    b_up: Optional[jax.Array],  # noqa: UP045  (jax_op documents Optional[...])
    b_down: Optional[jax.Array],  # noqa: UP045
    activation: str,
    has_gate: bool,
    transposed: bool,
    impl_up: str,
    impl_down: str,
) -> jax.Array:
    """The whole experts forward: sort, ragged dot, activation in f32, ragged dot, un-sort, weighted sum."""
    y, perm, sorted_ids, group_sizes = _up(hidden, ids, w_up, b_up, transposed, impl_up)
    act = ACTIVATIONS[activation]
    if has_gate:
        gate, up = jnp.split(y, 2, axis=-1)
        x = act(gate.astype(jnp.float32)).astype(y.dtype) * up
    else:
        x = act(y.astype(jnp.float32)).astype(y.dtype)
    return _down(x, weights, perm, sorted_ids, group_sizes, w_down, b_down, transposed, impl_down, hidden.dtype)


def experts_up(
    hidden: jax.Array,
    ids: jax.Array,
    w_up: jax.Array,
    b_up: Optional[jax.Array],  # noqa: UP045
    transposed: bool,
    impl: str,
) -> tuple[jax.Array, jax.Array]:
    """First half, for models whose gate runs in torch (custom ``_apply_gate``): projections and the sort order."""
    y, perm, _, _ = _up(hidden, ids, w_up, b_up, transposed, impl)
    return y, perm


def experts_down(
    x: jax.Array,
    ids: jax.Array,
    weights: jax.Array,
    perm: jax.Array,
    w_down: jax.Array,
    b_down: Optional[jax.Array],  # noqa: UP045
    transposed: bool,
    impl: str,
    out_dtype: str,
) -> jax.Array:
    """Second half: down projection, mask, routing weights, un-sort and sum."""
    flat = ids.reshape(-1).astype(jnp.int32)
    sorted_ids = flat[perm]
    experts_range = jnp.arange(w_down.shape[0], dtype=jnp.int32)
    group_sizes = (sorted_ids[:, None] == experts_range[None, :]).sum(0, dtype=jnp.int32)
    return _down(x, weights, perm, sorted_ids, group_sizes, w_down, b_down, transposed, impl, jnp.dtype(out_dtype))


def ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, impl: str) -> jax.Array:
    """``lhs[M, K] @ rhs[G, N, K].mT -> [M, N]`` by groups (the Hub kernel's ``ragged_dot``)."""
    return ragged_dot_general(lhs, rhs, group_sizes.astype(jnp.int32), False, impl)


# ---- backward: one op per layer too, the vector-Jacobian product of the forward ----------------------------
# Reverse mode cannot go through the "grouped" loop (a fori_loop with a data-dependent trip count), so the
# backward runs jax.lax's ragged dot there; tokamax's implementations have their own VJPs.
def _differentiable(impl: str) -> str:
    return "lax" if impl == "grouped" else impl


def _no_grad(x: Optional[jax.Array], grad: Optional[jax.Array]) -> jax.Array:  # noqa: UP045
    """An absent bias has no gradient: an empty array stands in for it (jax_op returns arrays only)."""
    return jnp.zeros((0,), jnp.float32) if x is None or grad is None else grad


def experts_backward(
    grad: jax.Array,
    hidden: jax.Array,
    ids: jax.Array,
    weights: jax.Array,
    w_up: jax.Array,
    w_down: jax.Array,
    b_up: Optional[jax.Array],  # noqa: UP045
    b_down: Optional[jax.Array],  # noqa: UP045
    activation: str,
    has_gate: bool,
    transposed: bool,
    impl_up: str,
    impl_down: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Gradients of :func:`experts` for hidden, routing weights, both weights and both biases."""

    def forward(hidden, weights, w_up, w_down, b_up, b_down):  # noqa: ANN001, ANN202
        return experts(
            hidden, ids, weights, w_up, w_down, b_up, b_down, activation, has_gate, transposed,
            _differentiable(impl_up), _differentiable(impl_down),
        )  # fmt: skip

    _, vjp = jax.vjp(forward, hidden, weights, w_up, w_down, b_up, b_down)
    d_hidden, d_weights, d_w_up, d_w_down, d_b_up, d_b_down = vjp(grad.astype(hidden.dtype))
    return d_hidden, d_weights, d_w_up, d_w_down, _no_grad(b_up, d_b_up), _no_grad(b_down, d_b_down)


def experts_up_backward(
    grad_y: jax.Array,
    hidden: jax.Array,
    ids: jax.Array,
    w_up: jax.Array,
    b_up: Optional[jax.Array],  # noqa: UP045
    transposed: bool,
    impl: str,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Gradients of :func:`experts_up`'s projections for hidden, w_up and b_up (the sort order has none)."""

    def forward(hidden, w_up, b_up):  # noqa: ANN001, ANN202
        return _up(hidden, ids, w_up, b_up, transposed, _differentiable(impl))[0]

    _, vjp = jax.vjp(forward, hidden, w_up, b_up)
    d_hidden, d_w_up, d_b_up = vjp(grad_y.astype(hidden.dtype))
    return d_hidden, d_w_up, _no_grad(b_up, d_b_up)


def experts_down_backward(
    grad: jax.Array,
    x: jax.Array,
    ids: jax.Array,
    weights: jax.Array,
    perm: jax.Array,
    w_down: jax.Array,
    b_down: Optional[jax.Array],  # noqa: UP045
    transposed: bool,
    impl: str,
    out_dtype: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Gradients of :func:`experts_down` for x, routing weights, w_down and b_down."""

    def forward(x, weights, w_down, b_down):  # noqa: ANN001, ANN202
        return experts_down(x, ids, weights, perm, w_down, b_down, transposed, _differentiable(impl), out_dtype)

    _, vjp = jax.vjp(forward, x, weights, w_down, b_down)
    d_x, d_weights, d_w_down, d_b_down = vjp(grad.astype(jnp.dtype(out_dtype)))
    return d_x, d_weights, d_w_down, _no_grad(b_down, d_b_down)
