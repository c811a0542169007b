"""Gap ``autocast_default_float16``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="autocast_default_float16",
    breaks="torch.autocast('tpu') without a dtype computes in float16, not bfloat16: TorchTPU's device module answers "
    "bfloat16 (torch.tpu._get_autocast_dtype()) but never sets torch's autocast dtype for the device, whose "
    "default is float16 (Trainer and accelerate pass bfloat16 explicitly; a bare torch.autocast('tpu') does not)",
    evidence="0.2.0 [run: torch.get_autocast_dtype('tpu') is torch.float16 once TorchTPU has set the device up]",
    emulator="torch's autocast dtype for the device stays float16, as TorchTPU leaves it",
    workaround="autocast_defaults_to_bfloat16",
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show autocast_default_float16``): raises while the gap is present
PROBE = """
a = torch.ones(2, 2, device=DEVICE)
with torch.autocast(DEVICE):  # no dtype: the device's default autocast dtype
    product = a @ a
if product.dtype != torch.bfloat16:
    raise RuntimeError(f"torch.autocast('tpu') computed a matmul in {product.dtype}, not torch.bfloat16")
"""
