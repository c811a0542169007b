"""Gap ``fully_masked_attention_row``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="fully_masked_attention_row",
    breaks="SDPA with a boolean mask: a query row masked everywhere (a fully padded sequence) returns a mix of the "
    "values instead of zeros",
    evidence="0.1.2.dev [ci]",
    emulator="the boolean mask becomes an additive mask with a large finite negative, so the row softmaxes uniformly",
    workaround="attention_zero_fully_masked_rows",
    ops=("scaled_dot_product_attention.bool_mask",),
    hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
)

# the smallest script that shows it (``hf-tpu gaps --show fully_masked_attention_row``): raises while the gap is present
PROBE = """
query = torch.randn(1, 1, 3, 8, device=DEVICE)
key = torch.randn(1, 1, 5, 8, device=DEVICE)
value = torch.full((1, 1, 5, 8), 1e4, device=DEVICE)
mask = torch.ones(1, 1, 3, 5, dtype=torch.bool, device=DEVICE)
mask[:, :, 1, :] = False  # query 1 may attend to nothing
out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
leak = out[0, 0, 1].abs().max().item()
if leak != 0.0:
    raise RuntimeError(f"a fully masked query row returned {leak:.3g} instead of 0")
"""
