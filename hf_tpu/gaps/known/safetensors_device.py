"""Gap ``safetensors_device``: its record (what breaks, the evidence, how the emulator reproduces it, what closes it)
and its probe."""

from hf_tpu.gaps.record import Gap

GAP = Gap(
    name="safetensors_device",
    breaks="safetensors' load_file(..., device='tpu') / safe_open(device='tpu') raise 'device tpu is invalid' "
    "(diffusers' disk offloading)",
    evidence="safetensors 0.8 (its device parser knows cpu, cuda, mps, npu, xpu, ... but not tpu)",
    emulator="nothing to emulate: it is safetensors' own code",
    workaround="safetensors_load_to_tpu",
    component="safetensors",
    signature=r"device tpu is invalid",
    emulation="every profile",
)

# the smallest script that shows it (``hf-tpu gaps --show safetensors_device``): raises while the gap is present
PROBE = """
from safetensors.torch import load_file, save_file

path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
save_file({"w": torch.arange(4.0)}, path)
loaded = load_file(path, device=DEVICE)["w"]
if loaded.device.type != "tpu":
    raise RuntimeError(f"loaded onto {loaded.device}")
"""
