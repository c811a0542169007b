"""Gap ``boolean_mask_indexing``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="boolean_mask_indexing",
    breaks="x[:, :, mask2d] (a multi-dimensional boolean index after a slice) raises a shape error",
    evidence="0.1.2.dev [ci]; fixed in 0.2.0 [run: the right shape and values]",
    emulator="aten::index raises IndexError 'shape mismatch' for such an index",
    workaround="boolean_mask_to_indices",
    signature=r"shape mismatch: indexing tensors could not be broadcast",
    ops=("aten.index.bool_mask",),
    fixed_in="0.2.0",
)

# the smallest script that shows it (``hf-tpu gaps --show boolean_mask_indexing``): raises while the gap is present
PROBE = """
x = torch.randn(2, 3, 5, 5, device=DEVICE)
mask = torch.eye(5, dtype=torch.bool, device=DEVICE)
picked = x[:, :, mask]
if tuple(picked.shape) != (2, 3, 5):
    raise RuntimeError(f"x[:, :, mask] has shape {tuple(picked.shape)}, expected (2, 3, 5)")
"""
