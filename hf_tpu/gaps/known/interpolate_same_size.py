"""Gap ``interpolate_same_size``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="interpolate_same_size",
    breaks="F.interpolate(mode='linear') to the size the input already has aborts the process",
    evidence="0.1.2.dev [ci]; fixed in 0.2.0 [run: a copy of the input]",
    emulator="RuntimeError 'TorchTPU aborts the process here' in upsample_linear1d",
    workaround="interpolate_same_size_is_a_copy",
    signature=r"upsample_linear1d",
    ops=("aten.upsample_linear1d",),
    fixed_in="0.2.0",
)

# the smallest script that shows it (``hf-tpu gaps --show interpolate_same_size``): raises while the gap is present
PROBE = """
x = torch.randn(1, 4, 19, device=DEVICE)
print(F.interpolate(x, size=19, mode="linear").cpu().shape)
"""
