"""Gap ``avg_pool1d_gradient``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="avg_pool1d_gradient",
    breaks="F.avg_pool1d's output has no grad_fn: layers before it silently get no gradient",
    evidence="0.1.2.dev [ci]; 0.2.0 [wheel: a direct avg_pool1d kernel, so autograd's composite is bypassed]",
    emulator="an AutogradPrivateUse1 kernel that computes avg_pool1d without recording it",
    workaround="avg_pool1d_through_2d",
    ops=("avg_pool1d",),
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show avg_pool1d_gradient``): raises while the gap is present
PROBE = """
x = torch.randn(2, 3, 8, device=DEVICE, requires_grad=True)
pooled = F.avg_pool1d(x, 2)
if pooled.grad_fn is None:
    raise RuntimeError("avg_pool1d's output is not part of the autograd graph")
pooled.sum().backward()
"""
