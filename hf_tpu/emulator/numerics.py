"""TPU numerics: what a float32 matmul, convolution or attention computes on a chip, eager and compiled.

The rules, and the evidence for each ([doc] TorchTPU's documentation and code, [xla] XLA's
precision semantics, [hf] Hugging Face's TPU CI, [reading] our best reading, unconfirmed on hardware):

1. The MXU multiplies bfloat16 operands and accumulates in float32 [doc: precision_management
   notebook, "MXUs only accept bfloat16 inputs but accumulate in float32"]. Vector units (adds,
   norms, softmax, activations) compute float32 in full [doc: same notebook] — the emulator leaves
   every non-matmul op to the CPU kernel.
2. float32 matmul-class ops (mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot, _grouped_mm, and
   everything that lowers to them: matmul, linear, einsum, the math attention path) and
   convolutions follow the matmul precision [doc: ``torch.tpu.precision`` docstring, "primarily
   used for operations involving matrix multiplication (e.g. matmul and convolution)"]:
   - DEFAULT — ``torch.get_float32_matmul_precision() == "medium"``, TorchTPU's default after device
     init [doc: loader; verified on the 0.2.0 wheel]: one bf16 pass. Emulated as operands rounded to
     bfloat16 (round to nearest even, as a float->bfloat16 cast), then a float32 matmul: bf16 x bf16
     products are exact in float32, so this is the MXU's result up to accumulation order.
   - HIGH — "high": three bf16 passes (bf16_3x) [doc: "HIGH (3-pass): multiplies the first 16 bits";
     xla: PrecisionConfig HIGH]. Emulated as a_hi*b_hi + a_hi*b_lo + a_lo*b_hi with a_hi = bf16(a),
     a_lo = bf16(a - a_hi), computed as one float32 matmul over operands concatenated along the
     contracting dimension [reading: XLA's summation order of the three passes is not documented].
   - HIGHEST — "highest": full float32 (XLA's 6-pass bf16_6x) [doc]. Emulated as the CPU's float32
     kernel [reading: 6 passes recover all 24 bits; the last-bit rounding may differ on a chip].
   HIGH for ``_grouped_mm`` runs as DEFAULT (its offsets can split the contracting dimension), and
   convolution backward at HIGH runs as HIGHEST [reading: emulator simplifications, both rare].
3. bfloat16 and float16 operands: bf16 products, float32 accumulation, output rounded to the
   operand dtype [doc: MXU]. The CPU kernels already do this; the emulator changes nothing
   [reading for float16: TorchTPU's lowering of fp16 dots is not documented].
4. Attention (``F.scaled_dot_product_attention``) computes in bfloat16 whatever the precision
   setting: q, k, v (and a float mask) in bfloat16, the output cast back [hf: gap
   ``attention_precision``, 108 of 115 precision failures in the TPU CI; the probe measures ~1e-3
   relative error]. The emulator computes what a bfloat16 flash kernel does: scores, softmax max and
   sum in float32, the probabilities rounded to bfloat16 before they multiply v, the output rounded
   to bfloat16 [reading: TorchTPU's kernel internals are not public]. Decode-sized calls compute it
   in the core (``csrc/aten/attention.cpp``), others run the CPU's bfloat16 flash kernel; the two agree up
   to float32 summation order.
5. ``torch.tpu.precision(mode)`` overrides the global setting for ops run inside it [doc], and is a
   graph break under ``torch.compile`` [doc: source]. The emulator keeps one process-wide stack, so
   the autograd engine's worker thread sees the same precision as the caller [reading].
6. Compiled graphs follow the same rules with the precision in effect when the graph is compiled
   [reading: XLA bakes precision into the executable].

``HF_TPU_EMULATOR_PROFILE=ideal`` turns all of this off (CPU-exact results).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx

from hf_tpu.emulator import _build

TORCH_NAMES = ("medium", "high", "highest")  # index = the core's precision code (DEFAULT, HIGH, HIGHEST)
_lock = threading.Lock()  # guards the precision stack; nothing under it imports or calls out
_global = 0
_stack: list[int] = []
_enabled = True


def _sync() -> None:
    _build.load().set_matmul_precision(_stack[-1] if _stack else _global)


def install(enabled: bool) -> None:
    """Turn TPU numerics on (profile torch_tpu) or off (ideal), and take over torch's matmul-precision knobs."""
    global _enabled
    _enabled = enabled
    _build.load().set_tpu_numerics(enabled)
    _sync()
    _patch_torch()


def enabled() -> bool:
    return _enabled


def current() -> int:
    """The precision code in effect: 0 DEFAULT, 1 HIGH, 2 HIGHEST."""
    return _stack[-1] if _stack else _global


def set_global(name: str) -> None:
    global _global
    if name not in TORCH_NAMES:
        raise ValueError(f"Invalid float32 matmul precision {name!r}; TPU supports {', '.join(TORCH_NAMES)}.")
    with _lock:
        _global = TORCH_NAMES.index(name)
        _sync()


def get_global() -> str:
    return TORCH_NAMES[_global]


@contextmanager
def scoped(code: int) -> Iterator[None]:
    """Run the block at precision ``code`` (``torch.tpu.precision`` underneath)."""
    with _lock:
        _stack.append(code)
        _sync()
    try:
        yield
    finally:
        with _lock:
            _stack.pop()
            _sync()


def _patch_torch() -> None:
    """TorchTPU owns ``torch.{set,get}_float32_matmul_precision`` after init, default ``"medium"``.

    The CPU's own precision setting is left untouched, so CPU references stay float32.
    """
    if getattr(torch.set_float32_matmul_precision, "_hf_tpu", False):
        return

    def set_float32_matmul_precision(precision: str) -> None:
        set_global(precision)

    def get_float32_matmul_precision() -> str:
        return get_global()

    for fn, original in (
        (set_float32_matmul_precision, torch.set_float32_matmul_precision),
        (get_float32_matmul_precision, torch.get_float32_matmul_precision),
    ):
        fn.__doc__ = original.__doc__
        fn._hf_tpu = True  # type: ignore[attr-defined]
    torch.set_float32_matmul_precision = set_float32_matmul_precision
    torch.get_float32_matmul_precision = get_float32_matmul_precision


# ---- compiled graphs ------------------------------------------------------------------------

aten = torch.ops.aten
_MATMUL_OPERANDS = {
    aten.mm: (0, 1),
    aten.bmm: (0, 1),
    aten.addmm: (1, 2),
    aten.baddbmm: (1, 2),
    aten.addbmm: (1, 2),
    aten.mv: (0, 1),
    aten.addmv: (1, 2),
    aten.dot: (0, 1),
    aten._grouped_mm: (0, 1),
}
# Ops that only re-index their input: rounding commutes with them (it is elementwise).
_VIEW_OPS = frozenset(
    (aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
     aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default, aten.alias.default)
)  # fmt: skip


def graph_key(gaps: frozenset[str]) -> tuple:
    """What a compiled graph's numerics depend on (part of the compile cache key)."""
    return (_enabled, current(), "attention_precision" in gaps, "fully_masked_attention_row" in gaps)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_f32(node: Any) -> bool:
    val = _val(node)
    return isinstance(val, torch.Tensor) and val.dtype == torch.float32


class _Rewriter:
    """Inserts the emulator's numerics into an ATen graph, node by node (the eager rules of the core)."""

    def __init__(self, graph: torch.fx.Graph, precision: int, gaps: frozenset[str]) -> None:
        self.graph = graph
        self.precision = precision
        self.gaps = gaps
        self.placeholders = list(graph.find_nodes(op="placeholder"))
        self.rounded: dict[torch.fx.Node, torch.fx.Node] = {}  # graph input -> its rounded copy (a new input)

    def call(self, op: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.graph.call_function(op, args, kwargs)

    def round(self, x: Any) -> torch.fx.Node:
        """``x`` rounded to bfloat16. A graph input (or a view of one: a weight's ``t()``) is rounded by the
        caller instead, as an extra input (see ``apply_to_graph``): a weight then once per version, not per call."""
        views = []
        root = x
        while isinstance(root, torch.fx.Node) and root.op == "call_function" and root.target in _VIEW_OPS:
            views.append(root)
            root = root.args[0]
        if not (isinstance(root, torch.fx.Node) and root.op == "placeholder" and _is_f32(root)):
            return self.call(torch.ops.hf_tpu_emulator.round_to_bf16.default, x)
        if root not in self.rounded:
            last = next(reversed(self.rounded.values()), self.placeholders[-1])
            with self.graph.inserting_after(last):
                copy = self.graph.placeholder(f"{root.name}_bf16")
            copy.meta["val"] = _val(root)
            self.rounded[root] = copy
        out = self.rounded[root]
        for view in reversed(views):
            out = self.call(view.target, out, *view.args[1:], **view.kwargs)
        return out

    def split(self, x: Any) -> tuple[torch.fx.Node, torch.fx.Node]:
        hi = self.round(x)
        return hi, self.round(self.call(aten.sub.Tensor, x, hi))

    def matmul(self, node: torch.fx.Node) -> None:
        a_i, b_i = _MATMUL_OPERANDS[node.target.overloadpacket]
        a, b = node.args[a_i], node.args[b_i]
        if self.precision >= 2 or not (_is_f32(a) and _is_f32(b)):
            return
        args = list(node.args)
        with self.graph.inserting_before(node):
            if self.precision == 0 or node.target.overloadpacket is aten._grouped_mm:
                args[a_i], args[b_i] = self.round(a), self.round(b)
            else:
                a_hi, a_lo = self.split(a)
                b_hi, b_lo = self.split(b)
                b16 = self.call(aten.add.Tensor, b_hi, b_lo)
                args[a_i] = self.call(aten.cat.default, [a_hi, a_lo], -1)
                args[b_i] = self.call(aten.cat.default, [b16, b_hi], -1 if _val(b).dim() == 1 else -2)
        node.args = tuple(args)

    def convolution(self, node: torch.fx.Node) -> None:
        x, w = node.args[0], node.args[1]
        if self.precision >= 2 or not (_is_f32(x) and _is_f32(w)):
            return
        args = list(node.args)
        with self.graph.inserting_before(node):
            if self.precision == 0:
                args[0], args[1] = self.round(x), self.round(w)
            else:
                transposed, groups = args[6], args[8]
                c = _val(x).shape[1] // groups
                x_hi, x_lo = self.split(x)
                w_hi, w_lo = self.split(w)
                w16 = self.call(aten.add.Tensor, w_hi, w_lo)

                def grouped(t: torch.fx.Node, dim: int) -> torch.fx.Node:
                    return self.call(aten.unflatten.int, t, dim, [groups, c])

                xs = self.call(aten.cat.default, [grouped(x_hi, 1), grouped(x_lo, 1)], 2)
                args[0] = self.call(aten.flatten.using_ints, xs, 1, 2)
                if transposed:
                    ws = self.call(aten.cat.default, [grouped(w16, 0), grouped(w_hi, 0)], 1)
                    args[1] = self.call(aten.flatten.using_ints, ws, 0, 1)
                else:
                    args[1] = self.call(aten.cat.default, [w16, w_hi], 1)
        node.args = tuple(args)

    def convolution_backward(self, node: torch.fx.Node) -> None:
        if self.precision != 0:
            return
        args = list(node.args)
        with self.graph.inserting_before(node):
            for i in range(3):
                if _is_f32(args[i]):
                    args[i] = self.round(args[i])
        node.args = tuple(args)

    def _mask(self, mask: Any, dtype: torch.dtype) -> Any:
        val = _val(mask)
        if not isinstance(val, torch.Tensor):
            return mask
        lowest = torch.finfo(dtype).min
        if val.dtype == torch.bool:
            if "fully_masked_attention_row" not in self.gaps:
                return mask
            return self._bool_to_additive(mask, dtype)
        if val.dtype == dtype:
            return mask
        clamped = self.call(aten.clamp.default, mask, lowest, -lowest)
        return self.call(aten._to_copy.default, clamped, dtype=dtype)

    def _bool_to_additive(self, mask: Any, dtype: torch.dtype) -> torch.fx.Node:
        zero = self.call(aten.scalar_tensor.default, 0.0, dtype=dtype)
        low = self.call(aten.scalar_tensor.default, torch.finfo(dtype).min, dtype=dtype)
        return self.call(aten.where.self, mask, zero, low)

    def attention(self, node: torch.fx.Node, tensors: int, mask_key: str, outputs: int) -> None:
        query = node.args[0 if tensors == 3 else 1]
        in_bf16 = "attention_precision" in self.gaps and _is_f32(query)
        dtype = torch.bfloat16 if in_bf16 else _val(query).dtype
        args = list(node.args)
        kwargs = dict(node.kwargs)
        with self.graph.inserting_before(node):
            if in_bf16:
                for i in range(tensors):
                    args[i] = self.call(aten._to_copy.default, args[i], dtype=torch.bfloat16)
            if kwargs.get(mask_key) is not None:
                kwargs[mask_key] = self._mask(kwargs[mask_key], dtype)
        node.args, node.kwargs = tuple(args), kwargs
        if not in_bf16:
            return
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] < outputs:
                with self.graph.inserting_after(user):
                    back = self.call(aten._to_copy.default, user, dtype=torch.float32)
                user.replace_all_uses_with(back, delete_user_cb=lambda n, back=back: n is not back)


def apply_to_graph(gm: torch.fx.GraphModule, gaps: frozenset[str]) -> list[int]:
    """Rewrite an ATen graph (before it is compiled for the CPU) so it computes what the chip would.

    Returns the positions of the inputs whose bfloat16 rounding the graph now takes as extra inputs, after its
    own, in this order: the caller passes ``rounded_operand(input)`` for each (the eager weight cache)."""
    if not _enabled:
        return []
    rewriter = _Rewriter(gm.graph, current(), gaps)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not hasattr(node.target, "overloadpacket"):
            continue
        packet = node.target.overloadpacket
        if packet in _MATMUL_OPERANDS:
            rewriter.matmul(node)
        elif packet is aten.convolution:
            rewriter.convolution(node)
        elif packet is aten.convolution_backward:
            rewriter.convolution_backward(node)
        elif packet is aten._scaled_dot_product_flash_attention_for_cpu:
            rewriter.attention(node, 3, "attn_mask", 1)
        elif packet is aten._scaled_dot_product_flash_attention_for_cpu_backward:
            rewriter.attention(node, 5, "attn_mask", 3)
    gm.graph.lint()
    gm.recompile()
    return [rewriter.placeholders.index(root) for root in rewriter.rounded]
