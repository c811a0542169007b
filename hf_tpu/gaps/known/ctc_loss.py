"""Gap ``ctc_loss``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="ctc_loss",
    breaks="F.ctc_loss aborts the process (a CTC model takes the whole test run down)",
    evidence="0.1.2.dev [ci]; 0.2.0 [wheel: a _ctc_loss kernel is registered]",
    emulator="RuntimeError 'TorchTPU aborts the process here' (HF_TPU_EMULATOR_GAPS=abort: a real abort)",
    workaround="ctc_loss_on_cpu",
    signature=r"ctc_loss",
    ops=("ctc_loss", "aten._ctc_loss"),
)

# the smallest script that shows it (``hf-tpu gaps --show ctc_loss``): raises while the gap is present
PROBE = """
log_probs = torch.randn(10, 2, 6, device=DEVICE).log_softmax(-1)  # (time, batch, classes)
targets = torch.randint(1, 6, (8,), device=DEVICE)  # flattened, as models pass them
loss = F.ctc_loss(
    log_probs, targets, torch.full((2,), 10, device=DEVICE), torch.full((2,), 4, device=DEVICE), reduction="sum"
)
print(loss.item())
"""
