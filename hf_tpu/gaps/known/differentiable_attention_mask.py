"""Gap ``differentiable_attention_mask``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="differentiable_attention_mask",
    breaks="SDPA refuses an attn_mask that requires grad (T5's relative attention bias, any learned bias): the flash "
    "kernel's autograd says it is not differentiable with respect to attn_mask",
    evidence="0.1.2.dev [ci: 37 failures]",
    emulator="the backend choice takes the flash kernel for such masks, whose autograd raises that error",
    workaround="attention_math_for_differentiable_mask",
    signature=r"not differentiable with respect to .?attn_mask",
    ops=("scaled_dot_product_attention.grad_mask",),
    hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
)

# the smallest script that shows it (``hf-tpu gaps --show differentiable_attention_mask``): raises while the gap is present
PROBE = """
query, key, value = (torch.randn(1, 2, 4, 8, device=DEVICE) for _ in range(3))
bias = torch.zeros(1, 2, 4, 4, device=DEVICE, requires_grad=True)  # a learned attention bias
F.scaled_dot_product_attention(query, key, value, attn_mask=bias).sum().backward()
if bias.grad is None:
    raise RuntimeError("no gradient reached the attention bias")
"""
