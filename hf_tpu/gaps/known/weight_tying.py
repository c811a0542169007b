"""Gap ``weight_tying``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="weight_tying",
    breaks="tpu and CPU tensors are not shallow-copy compatible: Module.to('tpu') replaces parameters (tied weights "
    "come back untied, the model takes twice the memory) and `param.data = tpu_tensor` raises (diffusers' group "
    "offloading)",
    evidence="0.1.2.dev [ci]; 0.2.0 [wheel: no _has_compatible_shallow_copy_type kernel]",
    emulator="aten::_has_compatible_shallow_copy_type answers False for tpu/CPU pairs",
    workaround="tpu_cpu_shallow_copy",
    signature=r"_has_compatible_shallow_copy_type|incompatible tensor type",
)

# the smallest script that shows it (``hf-tpu gaps --show weight_tying``): raises while the gap is present
PROBE = """
embedding = torch.nn.Embedding(7, 4)
lm_head = torch.nn.Linear(4, 7, bias=False)
lm_head.weight = embedding.weight  # tied, as in every causal LM
torch.nn.Sequential(embedding, lm_head).to(DEVICE)
if lm_head.weight is not embedding.weight:
    raise RuntimeError("Module.to() untied two parameters that were one")
"""
