"""Gap ``device_sharing``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="device_sharing",
    breaks="a second process cannot open a chip this one holds: the runtime aborts (tests that re-run themselves in a "
    "subprocess fail once the parent touched the device)",
    evidence="0.1.2.dev [ci: 37 failures]",
    emulator="the first process to use a chip locks it for its emulated host; another process aborts (RuntimeError "
    "naming the holder)",
    workaround=None,
    advice="run device work in one process per chip; hf-tpu names the process that holds a chip",
    signature=r"runtime cannot open|held by (another )?process",
    hidden_on_xla_cpu="XLA:CPU holds no chip: every process opens its own CPU client",
)

# the smallest script that shows it (``hf-tpu gaps --show device_sharing``): raises while the gap is present
PROBE = """
torch.ones(2, device=DEVICE).sum().item()  # this process now holds the chip
child = subprocess.run(
    [sys.executable, "-c", "import torch; print(torch.ones(2, device='tpu').sum().item())"],
    capture_output=True,
    text=True,
    timeout=600,
)
if child.returncode != 0:
    last = (child.stderr.strip().splitlines() or [""])[-1]
    raise RuntimeError(f"a second process could not use the chip (exit {child.returncode}): {last}")
"""
