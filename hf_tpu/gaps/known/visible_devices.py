"""Gap ``visible_devices``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="visible_devices",
    breaks="TPU_VISIBLE_DEVICES restricts the chips a process opens, but device_count() still reports every chip of "
    "the host",
    evidence="0.1.2.dev [ci]",
    emulator="device_count() reports the host's chips while only the visible ones can hold tensors",
    workaround=None,
    advice="launch one process per chip (`hf-tpu launch -n N`) instead of pinning chips; hf-tpu warns at set-up",
    needs_chips=2,
    hidden_on_xla_cpu="XLA:CPU gives TorchTPU one device",
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show visible_devices``): raises while the gap is present
PROBE = """
needs_chips(2)
child = subprocess.run(
    [sys.executable, "-c", "import torch; print(torch.accelerator.device_count())"],
    env={**os.environ, "TPU_VISIBLE_DEVICES": "0"},
    capture_output=True,
    text=True,
    timeout=600,
)
count = int(child.stdout.split()[-1])
if count != 1:
    raise RuntimeError(f"TPU_VISIBLE_DEVICES=0 makes one chip visible, but device_count() reports {count}")
"""
