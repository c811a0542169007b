"""Gap ``multinomial_unchecked``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="multinomial_unchecked",
    breaks="torch.multinomial on tpu draws from an invalid distribution (a negative or nan weight, an all-zero row) "
    "instead of raising as CPU and CUDA do: a bug upstream of sampling (a corrupted logit, a bad mask) goes "
    "unnoticed",
    evidence="0.2.0 [run: multinomial([-1, 2]) draws 1, multinomial([0, 0]) draws 0, without an error]",
    emulator="negative and nan weights count as 0 (an infinite one is always drawn), an all-zero row draws index 0",
    workaround=None,
    advice="check the weights yourself where they can be invalid (a check on the chip costs a host sync per call)",
    ops=("multinomial",),
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show multinomial_unchecked``): raises while the gap is present
PROBE = """
try:
    draw = torch.multinomial(torch.tensor([-1.0, 2.0], device=DEVICE), 1).cpu()
except RuntimeError as err:  # refused, as on CPU and CUDA: no gap
    print(f"refused: {err}")
else:
    raise RuntimeError(f"multinomial of the weights [-1, 2] drew {draw.tolist()} instead of refusing them")
"""
