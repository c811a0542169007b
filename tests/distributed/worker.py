"""Run by tests/distributed/test_tpu_dist.py under `hf-tpu launch -n N`: one process per emulated chip.

Each check prints "OK <name> rank=<r>" or raises (which fails the launch).
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def check_collectives(rank: int, n: int) -> None:
    """Every collective on tpu tensors (tpu_dist) equals the same collective on CPU tensors (gloo)."""
    cpu_group = dist.new_group(backend="gloo")

    def both(fn):
        torch.manual_seed(rank)
        base = torch.randn(n * 3, 2)
        tpu_result = fn(base.to("tpu"), None)
        cpu_result = fn(base.clone(), cpu_group)
        for a, b in zip(tpu_result, cpu_result, strict=True):
            assert a.device.type == "tpu", a.device
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)

    def all_reduce(x, g):
        dist.all_reduce(x, group=g)
        return [x]

    def all_reduce_max(x, g):
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g)
        return [x]

    def all_gather(x, g):
        out = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(out, x, group=g)
        return out

    def all_gather_into_tensor(x, g):
        out = x.new_empty((n * x.shape[0], x.shape[1]))
        dist.all_gather_into_tensor(out, x, group=g)
        return [out]

    def reduce_scatter_tensor(x, g):
        out = x.new_empty((x.shape[0] // n, x.shape[1]))
        dist.reduce_scatter_tensor(out, x, group=g)
        return [out]

    def reduce_scatter(x, g):
        out = x.new_empty((3, 2))
        dist.reduce_scatter(out, list(x.chunk(n)), group=g)
        return [out]

    def broadcast(x, g):
        dist.broadcast(x, src=n - 1, group=g)
        return [x]

    def all_to_all_single(x, g):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=g)
        return [out]

    def all_to_all(x, g):
        out = [torch.empty(3, 2, device=x.device) for _ in range(n)]
        dist.all_to_all(out, [c.contiguous() for c in x.chunk(n)], group=g)
        return out

    def send_recv(x, g):
        peer = (rank + 1) % n
        src = (rank - 1) % n
        out = torch.empty_like(x)
        reqs = [dist.isend(x, peer, group=g), dist.irecv(out, src, group=g)]
        for r in reqs:
            r.wait()
        return [out]

    for fn in (
        all_reduce,
        all_reduce_max,
        all_gather,
        all_gather_into_tensor,
        reduce_scatter_tensor,
        reduce_scatter,
        broadcast,
        all_to_all_single,
        all_to_all,
        send_recv,
    ):
        both(fn)
        print(f"OK {fn.__name__} rank={rank}", flush=True)
    dist.barrier(device_ids=[torch.accelerator.current_device_index()])  # transformers' call
    print(f"OK barrier rank={rank}", flush=True)


def check_tensor_parallel(rank: int, n: int) -> None:
    """parallelize_module on an MLP over a "tpu" mesh equals the unsharded MLP."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (n,))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    x = torch.randn(5, 16)
    reference = copy.deepcopy(mlp)  # stays on CPU: the independent reference, forward and backward
    expected = reference(x)
    expected.sum().backward()
    sharded = parallelize_module(mlp.to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    local = sharded[0].weight.to_local()
    assert local.shape == (32 // n, 16) and local.device.type == "tpu", local.shape
    out = sharded(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    for index in (0, 2):  # column- and row-sharded weights, their biases: every gradient value, gathered
        for name in ("weight", "bias"):
            grad = getattr(sharded[index], name).grad
            full = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
            want = getattr(reference[index], name).grad
            torch.testing.assert_close(full.cpu(), want, rtol=1e-4, atol=1e-5, msg=f"{index}.{name}.grad")
    print(f"OK tensor_parallel rank={rank}", flush=True)


def check_fsdp2(rank: int, n: int) -> None:
    """FSDP2 (fully_shard) training step over a "tpu" mesh equals the same step on one CPU process."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("tpu", (n,))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model.load_state_dict(ref.state_dict())
    x = torch.randn(2 * n, 8)
    # reference: the full batch on one process (mean loss), one SGD step
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x).pow(2).mean().backward()
    ref_opt.step()
    model.to("tpu")
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    local = x.chunk(n)[rank].to("tpu")
    model(local).pow(2).mean().backward()  # gradients are averaged over ranks by reduce-scatter
    opt.step()
    full = {k: v.full_tensor().cpu() for k, v in model.state_dict().items()}
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(full[key], value, rtol=1e-5, atol=1e-6)
    print(f"OK fsdp2 rank={rank}", flush=True)


def check_identity(rank: int, n: int) -> None:
    assert torch.accelerator.device_count() == 1 and torch.accelerator.current_device_index() == 0
    assert torch.ones(1, device="tpu").device == torch.device("tpu:0")
    mesh = torch.tpu.distributed.topology_aware_mesh((n,))
    assert torch.equal(mesh, torch.arange(n))
    print(f"OK identity rank={rank}", flush=True)


def main() -> None:
    # References are CPU runs in float32: compare at TorchTPU's precision "highest" (the default rounds
    # matmul operands to bfloat16, as a chip does).
    torch.set_float32_matmul_precision("highest")
    init = init_device_mesh("tpu", (int(__import__("os").environ["WORLD_SIZE"]),))
    del init
    rank, n = dist.get_rank(), dist.get_world_size()
    for name in sys.argv[1:]:
        globals()[f"check_{name}"](rank, n)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
