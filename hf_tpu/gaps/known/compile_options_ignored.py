"""Gap ``compile_options_ignored``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="compile_options_ignored",
    breaks="torch.compile(backend='tpu', options={...}) ignores keys it does not read: a misspelt option (or one of "
    "Inductor's) silently does nothing",
    evidence="0.2.0 [wheel: TpuBackend reads its options with dict.get; run: an unknown key compiles without a word]",
    emulator="the same: unknown keys are ignored",
    workaround="unknown_compile_options_warn",
    emulation="every profile",
)

# the smallest script that shows it (``hf-tpu gaps --show compile_options_ignored``): raises while the gap is present
PROBE = """
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    double = torch.compile(lambda x: x * 2, backend="tpu", options={"async_compil": True})  # a typo
    double(torch.ones(2, device=DEVICE)).cpu()
if not any("async_compil" in str(w.message) for w in caught):
    raise RuntimeError("options={'async_compil': True} (async_compile misspelt) was ignored without a word")
"""
