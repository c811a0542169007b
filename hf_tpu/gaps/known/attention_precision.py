"""Gap ``attention_precision``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="attention_precision",
    breaks="SDPA computes in bfloat16 whatever torch.set_float32_matmul_precision says: float32 attention is off by "
    "bfloat16 rounding even at 'highest'",
    evidence="0.1.2.dev [ci: 108 of 115 float32 precision failures pass at 'highest', the rest are attention]",
    emulator="q, k, v (and float masks) in bfloat16 for the attention kernel, output cast back",
    workaround="attention_math_at_highest",
    ops=("scaled_dot_product_attention",),
    hidden_on_xla_cpu="its flash attention is a Pallas kernel; XLA:CPU runs TorchTPU's math path",
)

# the smallest script that shows it (``hf-tpu gaps --show attention_precision``): raises while the gap is present
PROBE = """
torch.set_float32_matmul_precision("highest")
generator = torch.Generator().manual_seed(0)
query, key, value = (torch.randn(2, 4, 16, 32, generator=generator) for _ in range(3))
reference = F.scaled_dot_product_attention(query.double(), key.double(), value.double())
out = F.scaled_dot_product_attention(*(t.to(DEVICE) for t in (query, key, value))).cpu().double()
error = ((out - reference).abs().mean() / reference.abs().mean()).item()
if error > 1e-5:  # float32 lands near 1e-7, bfloat16 near 1e-3
    raise RuntimeError(f"float32 attention at precision 'highest' has {error:.1e} relative error")
"""
