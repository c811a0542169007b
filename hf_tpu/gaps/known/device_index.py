"""Gap ``device_index``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="device_index",
    breaks="Tensor.to(<int>) / Module.to(<int>) ignore the index and land on chip 0, so accelerate's integer device "
    "maps put every layer on one chip",
    evidence="0.1.2.dev [ci: 25 failures]",
    emulator="Tensor.to and Module.to map an int device to tpu:0 (plain process on a multi-chip host)",
    workaround="int_device_means_that_chip",
    needs_chips=2,
    hidden_on_xla_cpu="XLA:CPU gives TorchTPU one device",
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show device_index``): raises while the gap is present
PROBE = """
needs_chips(2)
last = torch.accelerator.device_count() - 1
moved = torch.zeros(2).to(last)
if moved.device.index != last:
    raise RuntimeError(f".to({last}) returned a tensor on {moved.device}")
"""
