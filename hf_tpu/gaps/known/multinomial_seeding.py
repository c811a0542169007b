"""Gap ``multinomial_seeding``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="multinomial_seeding",
    breaks="torch.multinomial ignores the seed and generator=, so sampling (generate(do_sample=True)) is not reproducible",
    evidence="0.1.2.dev [ci]; fixed in 0.2.0 [run: one seed, the same draws]",
    emulator="each multinomial call draws from a freshly, randomly seeded generator",
    workaround="seeded_multinomial",
    ops=("multinomial",),
    fixed_in="0.2.0",
)

# the smallest script that shows it (``hf-tpu gaps --show multinomial_seeding``): raises while the gap is present
PROBE = """
weights = torch.rand(3, 20, device=DEVICE) + 0.05
draws = []
for _ in range(2):
    torch.manual_seed(1234)
    draws.append(torch.multinomial(weights, 5).cpu())
if not torch.equal(draws[0], draws[1]):
    raise RuntimeError(f"one seed, two draws: {draws[0].tolist()} and {draws[1].tolist()}")
"""
