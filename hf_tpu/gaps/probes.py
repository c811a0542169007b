"""One standalone probe per known gap: the smallest script that shows it, with nothing but torch.

A probe raises (or the process aborts) while its gap is present and exits 0 once it is fixed; it exits
3 when the machine cannot show the gap (too few chips). Each is what a TorchTPU bug report needs, so
none imports hf-tpu: on a TPU VM, TorchTPU loads with ``import torch``; on a laptop, run it with
``HF_TPU_EMULATE=1``.
"""

from __future__ import annotations

import textwrap

from hf_tpu.gaps import GAPS, get

NOT_APPLICABLE = 3

PREAMBLE = """\
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

DEVICE = "tpu"


def needs_chips(n):
    if torch.accelerator.device_count() < n:
        print(f"needs {n} chips, this machine has {torch.accelerator.device_count()}")
        sys.exit(3)

"""

# torch's exit race, made to happen: a process whose last backward ran on the device exits while autograd's
# worker thread still holds that backward's task (and in it a Python object). Pinned to one CPU, the main thread
# outranks the worker (SCHED_FIFO where the process may, else the worker runs SCHED_IDLE), so the worker is
# still inside that window when the main thread returns; the last exit handler then holds the GIL for 2 ms
# (a ctypes.PyDLL call keeps it) while the worker runs: the worker drops the task, waits for the GIL, and is
# still waiting when the interpreter starts finalizing, which ends the thread inside a noexcept destructor
# (std::terminate, status 134). Without the main thread's priority, the same happens in a fraction of runs
# that depends on the machine's scheduler. `python -c EXIT_RACE_CHILD N` pins it to the N-th allowed CPU.
EXIT_RACE_CHILD = """\
import atexit, ctypes, os, sys

atexit.register(ctypes.PyDLL(None).usleep, 2000)  # registered first, so it runs last
cpus = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cpus[int(sys.argv[1]) % len(cpus)] if len(sys.argv) > 1 else cpus[0]})
import torch

x = torch.ones(8, device="tpu", requires_grad=True)
(x * 2).sum().backward()  # starts autograd's device worker
workers = [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("pt_autograd_")]
assert workers, "no autograd device worker thread (pt_autograd_*) found"
for tid in workers:
    os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except PermissionError:
    pass
(x * 2).sum().backward()
"""

_BODIES = {
    "cholesky": """
spd = torch.eye(4, device=DEVICE) * 3.0
factor, info = torch.linalg.cholesky_ex(spd)
print(factor.diagonal().cpu())
""",
    "ctc_loss": """
log_probs = torch.randn(10, 2, 6, device=DEVICE).log_softmax(-1)  # (time, batch, classes)
targets = torch.randint(1, 6, (8,), device=DEVICE)  # flattened, as models pass them
loss = F.ctc_loss(
    log_probs, targets, torch.full((2,), 10, device=DEVICE), torch.full((2,), 4, device=DEVICE), reduction="sum"
)
print(loss.item())
""",
    "compile_inductor": """
double = torch.compile(lambda x: x * 2, backend="inductor")
print(double(torch.ones(3, device=DEVICE)).cpu())
""",
    "weight_tying": """
embedding = torch.nn.Embedding(7, 4)
lm_head = torch.nn.Linear(4, 7, bias=False)
lm_head.weight = embedding.weight  # tied, as in every causal LM
torch.nn.Sequential(embedding, lm_head).to(DEVICE)
if lm_head.weight is not embedding.weight:
    raise RuntimeError("Module.to() untied two parameters that were one")
""",
    "fully_masked_attention_row": """
query = torch.randn(1, 1, 3, 8, device=DEVICE)
key = torch.randn(1, 1, 5, 8, device=DEVICE)
value = torch.full((1, 1, 5, 8), 1e4, device=DEVICE)
mask = torch.ones(1, 1, 3, 5, dtype=torch.bool, device=DEVICE)
mask[:, :, 1, :] = False  # query 1 may attend to nothing
out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
leak = out[0, 0, 1].abs().max().item()
if leak != 0.0:
    raise RuntimeError(f"a fully masked query row returned {leak:.3g} instead of 0")
""",
    "multinomial_seeding": """
weights = torch.rand(3, 20, device=DEVICE) + 0.05
draws = []
for _ in range(2):
    torch.manual_seed(1234)
    draws.append(torch.multinomial(weights, 5).cpu())
if not torch.equal(draws[0], draws[1]):
    raise RuntimeError(f"one seed, two draws: {draws[0].tolist()} and {draws[1].tolist()}")
""",
    "multinomial_unchecked": """
try:
    draw = torch.multinomial(torch.tensor([-1.0, 2.0], device=DEVICE), 1).cpu()
except RuntimeError as err:  # refused, as on CPU and CUDA: no gap
    print(f"refused: {err}")
else:
    raise RuntimeError(f"multinomial of the weights [-1, 2] drew {draw.tolist()} instead of refusing them")
""",
    "differentiable_attention_mask": """
query, key, value = (torch.randn(1, 2, 4, 8, device=DEVICE) for _ in range(3))
bias = torch.zeros(1, 2, 4, 4, device=DEVICE, requires_grad=True)  # a learned attention bias
F.scaled_dot_product_attention(query, key, value, attn_mask=bias).sum().backward()
if bias.grad is None:
    raise RuntimeError("no gradient reached the attention bias")
""",
    "avg_pool1d_gradient": """
x = torch.randn(2, 3, 8, device=DEVICE, requires_grad=True)
pooled = F.avg_pool1d(x, 2)
if pooled.grad_fn is None:
    raise RuntimeError("avg_pool1d's output is not part of the autograd graph")
pooled.sum().backward()
""",
    "boolean_mask_indexing": """
x = torch.randn(2, 3, 5, 5, device=DEVICE)
mask = torch.eye(5, dtype=torch.bool, device=DEVICE)
picked = x[:, :, mask]
if tuple(picked.shape) != (2, 3, 5):
    raise RuntimeError(f"x[:, :, mask] has shape {tuple(picked.shape)}, expected (2, 3, 5)")
""",
    "interpolate_same_size": """
x = torch.randn(1, 4, 19, device=DEVICE)
print(F.interpolate(x, size=19, mode="linear").cpu().shape)
""",
    "attention_precision": """
torch.set_float32_matmul_precision("highest")
generator = torch.Generator().manual_seed(0)
query, key, value = (torch.randn(2, 4, 16, 32, generator=generator) for _ in range(3))
reference = F.scaled_dot_product_attention(query.double(), key.double(), value.double())
out = F.scaled_dot_product_attention(*(t.to(DEVICE) for t in (query, key, value))).cpu().double()
error = ((out - reference).abs().mean() / reference.abs().mean()).item()
if error > 1e-5:  # float32 lands near 1e-7, bfloat16 near 1e-3
    raise RuntimeError(f"float32 attention at precision 'highest' has {error:.1e} relative error")
""",
    "device_index": """
needs_chips(2)
last = torch.accelerator.device_count() - 1
moved = torch.zeros(2).to(last)
if moved.device.index != last:
    raise RuntimeError(f".to({last}) returned a tensor on {moved.device}")
""",
    "device_index_out_of_range": """
beyond = torch.accelerator.device_count()  # one past the last chip of this process
try:
    placed = torch.ones(2, device=f"tpu:{beyond}").cpu()
except RuntimeError as err:  # refused: no gap
    print(f"refused: {err}")
else:
    raise RuntimeError(f"a tensor on tpu:{beyond}, beyond this process's {beyond} chip(s), was made without an error")
""",
    "visible_devices": """
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
""",
    "device_sharing": """
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
""",
    "record_stream": """
x = torch.ones(4, device=DEVICE)
x.record_stream(torch.accelerator.current_stream())
""",
    "autocast_integer_dtype": """
try:
    autocast = torch.autocast(DEVICE, dtype=torch.int8)
except (ValueError, RuntimeError) as err:  # refused, naming the dtype: no gap
    print(f"refused: {err}")
else:  # accepted: torch itself disables autocast (with a warning) for a dtype the backend does not list
    with autocast:
        try:
            product = torch.ones(2, 2, device=DEVICE) @ torch.ones(2, 2, device=DEVICE)
        except RuntimeError as err:  # the inputs were cast to int8, then the backend had no int8 matmul
            raise RuntimeError(f"torch.autocast accepted dtype=torch.int8; a float32 matmul ran in int8: {err}")
    if product.dtype != torch.float32:
        raise RuntimeError(f"torch.autocast accepted dtype=torch.int8; a float32 matmul came back as {product.dtype}")
""",
    "adamw_bfloat16_moments": """
import warnings

warnings.simplefilter("ignore")  # torch.tpu.optimizers is experimental and says so
layer = torch.nn.Linear(3, 2).to(DEVICE)
adamw = torch.tpu.optimizers.AdamW(lr=1e-3)  # bfloat16 moments: the default
group = adamw.init_param_group(layer)
grads = {name: torch.ones_like(p) for name, p in group.params.items()}
adamw.step(group, grads)
""",
    "autocast_default_float16": """
a = torch.ones(2, 2, device=DEVICE)
with torch.autocast(DEVICE):  # no dtype: the device's default autocast dtype
    product = a @ a
if product.dtype != torch.bfloat16:
    raise RuntimeError(f"torch.autocast('tpu') computed a matmul in {product.dtype}, not torch.bfloat16")
""",
    "autograd_exit_abort": f"""
# The abort is a race between the main thread's exit and autograd's device worker. The child makes it
# happen on purpose (see EXIT_RACE_CHILD), so a few runs show it: on one core its main thread outranks the
# worker, and its last exit handler holds the GIL while the worker runs.
child = {EXIT_RACE_CHILD!r}
for attempt in range(5):
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(
            f"run {{attempt + 1}}: a process that ran a backward exited with {{proc.returncode}} "
            f"(-6 or 134: aborted): {{proc.stderr.strip()[-200:]}}"
        )
""",
    "compile_options_ignored": """
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    double = torch.compile(lambda x: x * 2, backend="tpu", options={"async_compil": True})  # a typo
    double(torch.ones(2, device=DEVICE)).cpu()
if not any("async_compil" in str(w.message) for w in caught):
    raise RuntimeError("options={'async_compil': True} (async_compile misspelt) was ignored without a word")
""",
    "cpu_tensor_into_compiled_graph": """
add = torch.compile(lambda x, step: x + step.to(x.device), backend="tpu")
print(add(torch.ones(3, device=DEVICE), torch.tensor(2)).cpu())  # eager takes the CPU step; does the graph?
""",
    "safetensors_device": """
from safetensors.torch import load_file, save_file

path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
save_file({"w": torch.arange(4.0)}, path)
loaded = load_file(path, device=DEVICE)["w"]
if loaded.device.type != "tpu":
    raise RuntimeError(f"loaded onto {loaded.device}")
""",
}

PROBES: dict[str, str] = {gap.name: _BODIES[gap.name] for gap in GAPS}


def script(name: str) -> str:
    """The probe for gap ``name`` as a standalone script."""
    gap = get(name)
    header = textwrap.fill(f"Probe for '{name}': {gap.breaks}.", width=100, initial_indent="# ", subsequent_indent="# ")
    how = "# Exits 0 once the gap is fixed. On a TPU VM: python this.py; without a TPU: HF_TPU_EMULATE=1 python this.py"
    return f"{header}\n{how}\n{PREAMBLE}{PROBES[name].lstrip()}"
