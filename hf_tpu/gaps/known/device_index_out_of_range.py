"""Gap ``device_index_out_of_range``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="device_index_out_of_range",
    breaks="a tensor made on tpu:N with N beyond the process's chips lands on tpu:0 without an error "
    "(torch.ones(2, device='tpu:1') in a one-chip process): a device-placement bug goes unnoticed",
    evidence="0.2.0 [run: torch.ones(2, device='tpu:1') is a tensor on tpu:0]",
    emulator="not reproduced: the emulator refuses such an index, naming the process's chips",
    workaround=None,
    advice="use torch.device('tpu', torch.accelerator.current_device_index()), or check the index against "
    "torch.accelerator.device_count()",
    emulation="no",
)

# the smallest script that shows it (``hf-tpu gaps --show device_index_out_of_range``): raises while the gap is present
PROBE = """
beyond = torch.accelerator.device_count()  # one past the last chip of this process
try:
    placed = torch.ones(2, device=f"tpu:{beyond}").cpu()
except RuntimeError as err:  # refused: no gap
    print(f"refused: {err}")
else:
    raise RuntimeError(f"a tensor on tpu:{beyond}, beyond this process's {beyond} chip(s), was made without an error")
"""
