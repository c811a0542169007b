"""Gap ``adamw_bfloat16_moments``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="adamw_bfloat16_moments",
    breaks="torch.tpu.optimizers.AdamW() keeps its moments in bfloat16 by default, and its step fails on float32 "
    "parameters ('expected dtype c10::BFloat16 for `end` but got dtype float': torch.optim.adam's lerp_ of a "
    "bfloat16 moment toward a float32 gradient)",
    evidence="0.2.0 [run: AdamW(lr=...).step on a float32 nn.Linear's parameters]",
    emulator="the same RuntimeError from the emulator's AdamW, for moments and gradients of different dtypes",
    workaround=None,
    advice="pass use_bfloat16_moments=False for float32 parameters (or train in bfloat16)",
    signature=r"expected dtype c10::BFloat16 for `end`",
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show adamw_bfloat16_moments``): raises while the gap is present
PROBE = """
import warnings

warnings.simplefilter("ignore")  # torch.tpu.optimizers is experimental and says so
layer = torch.nn.Linear(3, 2).to(DEVICE)
adamw = torch.tpu.optimizers.AdamW(lr=1e-3)  # bfloat16 moments: the default
group = adamw.init_param_group(layer)
grads = {name: torch.ones_like(p) for name, p in group.params.items()}
adamw.step(group, grads)
"""
