"""Gap ``compile_inductor``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="compile_inductor",
    breaks="torch.compile(backend='inductor') with TPU inputs is refused (anything that compiles without asking the "
    "device for its backend fails)",
    evidence="0.1.2.dev [ci]; 0.2.0 [wheel: _TorchCompileInductorWrapper raises for TPU inputs]",
    emulator="the same RuntimeError, on every profile",
    workaround=None,
    advice="compile with backend='tpu' (or no backend: TPU inputs select it)",
    signature=r"[Ii]nductor.*(TPU|tpu)|(TPU|tpu).*[Ii]nductor",
    emulation="every profile",
)

# the smallest script that shows it (``hf-tpu gaps --show compile_inductor``): raises while the gap is present
PROBE = """
double = torch.compile(lambda x: x * 2, backend="inductor")
print(double(torch.ones(3, device=DEVICE)).cpu())
"""
