"""Gap ``cpu_tensor_into_compiled_graph``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="cpu_tensor_into_compiled_graph",
    breaks="a compiled graph refuses a CPU tensor input that eager mode accepts ('execute(): failed to prepare compiled "
    "mode arguments: ... expected tensor to be on tpu, got cpu'): transformers' StaticCache when the compiled "
    "region sets it up (its cumulative_length starts on the CPU), diffusers' QwenImage (its pos_freqs buffer)",
    evidence="0.2.0 [run: the real wheel on XLA:CPU, a two-line compiled function and both models]",
    emulator="the compile backend refuses a graph's CPU tensor inputs (pinned host memory excepted) with TorchTPU's message",
    workaround="compiled_graphs_take_cpu_inputs",
    signature=r"failed to prepare compiled mode arguments|expected tensor to be on tpu, got cpu",
    emulation="python",
)

# the smallest script that shows it (``hf-tpu gaps --show cpu_tensor_into_compiled_graph``): raises while the gap is present
PROBE = """
add = torch.compile(lambda x, step: x + step.to(x.device), backend="tpu")
print(add(torch.ones(3, device=DEVICE), torch.tensor(2)).cpu())  # eager takes the CPU step; does the graph?
"""
