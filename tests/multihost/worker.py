"""Run by tests/multihost under `hf-tpu launch --emulate-hosts 2 -n 2`: one process per emulated chip.

`worker.py CHECK MODEL_DIR OUT_DIR`; rank 0 writes what the test compares to OUT_DIR/<check>.json.
- layout:   topology_aware_mesh((2, 2)) and the host of every rank
- hybrid:   transformers' tensor parallel inside each host (tp_size=2) and data parallel across hosts
            (dp_replicate_size=2): 3 SGD steps, the losses and the collective bytes of a step (ICI, DCN)
- naive:    tp_size=4 over both hosts, the same steps (what crosses hosts without the hybrid layout)
- generate: greedy tokens with the hybrid layout
- die:      the hybrid steps, but at step 2 the first rank of host 1 kills its whole host (a power loss)
- restart:  a checkpointed loop (one chip per host) that fails once on host 1; torchrun restarts every rank
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import hf_tpu

# Float32 at precision "highest": the references are one chip's at the same precision, compared exactly
# where the sums' order is the only difference (losses within 1e-5, the same tokens).
torch.set_float32_matmul_precision("highest")
STEPS = 3
CHECK, MODEL, OUT = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def batch() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 128, (4, 16), generator=generator)


def write(payload: dict) -> None:
    if dist.get_rank() == 0:
        (OUT / f"{CHECK}.json").write_text(json.dumps(payload))


def kill_my_host() -> None:
    """SIGKILL every process of this emulated host (the host launcher, torchrun, every rank): a power loss."""
    mine = f"HF_TPU_EMULATOR_HOST={os.environ['HF_TPU_EMULATOR_HOST']}".encode()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mine in environ and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    os.kill(os.getpid(), signal.SIGKILL)


def train(tp: int, dp: int) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    config = DistributedConfig(tp_size=tp, dp_replicate_size=dp)
    model = AutoModelForCausalLM.from_pretrained(MODEL, distributed_config=config, dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # TP mixes DTensors and tensors
    replica = dist.get_rank() // tp  # ranks of one host are consecutive: the replica is the host
    ids = batch().chunk(dp)[replica].to("tpu")
    losses, counted = [], None
    for step in range(STEPS):
        if CHECK == "die" and step == 2 and os.environ["HF_TPU_EMULATOR_HOST_INDEX"] == "1":
            if os.environ["LOCAL_RANK"] == "0":
                kill_my_host()
        with hf_tpu.count_collectives() as counts:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / dist.get_world_size())
        counted = counted or counts
    write({"losses": losses, "ici": counted.ici_bytes, "dcn": counted.dcn_bytes, "summary": counted.summary()})


def generate() -> None:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(
        MODEL, distributed_config=DistributedConfig(tp_size=2, dp_replicate_size=2), dtype=torch.float32
    )
    ids = batch()[:1, :8].to("tpu")
    tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, tokens.cpu().tolist())
    write({"tokens": everyone})


def layout() -> None:
    mesh = torch.tpu.distributed.topology_aware_mesh((2, 2))
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, os.environ["HF_TPU_EMULATOR_HOST_INDEX"])
    write({"mesh": mesh.tolist(), "hosts": hosts})


def restart() -> None:
    """A checkpointed loop: the state after every step is saved; a restarted rank resumes from it."""
    checkpoint = OUT / "checkpoint.pt"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to("tpu")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start, losses = 0, []
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, losses = state["step"], state["losses"]
    resumed_at = start
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))
    for step in range(start, 6):
        if step == 3 and dist.get_rank() == 1 and not (OUT / "planted").exists():
            (OUT / "planted").touch()  # a file, not TORCHELASTIC_RESTART_COUNT: that count is per host
            raise SystemExit("planted failure at step 3 (first attempt only)")
        loss = model(x[dist.get_rank()].to("tpu")).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / dist.get_world_size())
        dist.barrier()
        if dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1,
                        "losses": losses}, checkpoint)  # fmt: skip
        dist.barrier()
    # torchrun counts restarts per host (a host restarted for the other's failure may count 0): the largest
    restarts = torch.tensor([int(os.environ["TORCHELASTIC_RESTART_COUNT"])], device="tpu")
    dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
    write({"losses": losses, "restarts": int(restarts), "resumed_at": resumed_at})


def main() -> None:
    dist.init_process_group("tpu_dist")
    {"layout": layout, "hybrid": lambda: train(2, 2), "naive": lambda: train(4, 1), "die": lambda: train(2, 2),
     "generate": generate, "restart": restart}[CHECK]()  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
