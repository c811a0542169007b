"""Gap ``record_stream``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="record_stream",
    breaks="Tensor.record_stream on a tpu tensor is not implemented (diffusers' group offloading with streams)",
    evidence="0.2.0 [wheel: no record_stream kernel; reading: its boxed fallback raises]",
    emulator="RuntimeError \"operator 'aten::record_stream' is not implemented for TPU\", as TorchTPU's fallback says",
    workaround="record_stream_noop",
    signature=r"record_stream",
    ops=("record_stream",),
)

# the smallest script that shows it (``hf-tpu gaps --show record_stream``): raises while the gap is present
PROBE = """
x = torch.ones(4, device=DEVICE)
x.record_stream(torch.accelerator.current_stream())
"""
