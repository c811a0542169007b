"""Gap ``cholesky``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="cholesky",
    breaks="torch.linalg.cholesky / cholesky_ex are missing, so resize_token_embeddings fails (its new rows are drawn "
    "from a MultivariateNormal, which factorises the covariance)",
    evidence="0.1.2.dev [ci: 69 failures]; 0.2.0 [wheel: no kernel, only autocast entries]",
    emulator="RuntimeError \"operator 'aten::linalg_cholesky_ex' is not implemented for TPU\", as TorchTPU's fallback says",
    workaround="cholesky_on_cpu",
    signature=r"linalg_cholesky|cholesky_ex",
    ops=("aten.linalg_cholesky_ex", "aten.cholesky", "aten.cholesky_inverse"),
)

# the smallest script that shows it (``hf-tpu gaps --show cholesky``): raises while the gap is present
PROBE = """
spd = torch.eye(4, device=DEVICE) * 3.0
factor, info = torch.linalg.cholesky_ex(spd)
print(factor.diagonal().cpu())
"""
