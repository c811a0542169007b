"""The "tpu_dist" process group on emulated chips, one process each, launched with `hf-tpu launch`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_python

WORKER = Path(__file__).with_name("worker.py")


def launch(n: int, *checks: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HF_TPU_EMULATE"}
    env["PYTHONPATH"] = str(WORKER.parents[2])
    return subprocess.run(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", str(n), str(WORKER), *checks],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_ok(proc: subprocess.CompletedProcess, n: int, *checks: str) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    for check in checks:
        for rank in range(n):
            assert f"OK {check} rank={rank}" in proc.stdout, (check, rank, proc.stdout[-2000:])


def test_every_collective_matches_gloo_on_cpu_with_2_chips():
    names = ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter",
             "broadcast", "all_to_all_single", "all_to_all", "send_recv", "barrier"]  # fmt: skip
    proc = launch(2, "identity", "collectives")
    assert_ok(proc, 2, "identity", *names)


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.long)])
def test_tensor_parallel_mlp_equals_one_process(n):
    proc = launch(n, "identity", "tensor_parallel")
    assert_ok(proc, n, "identity", "tensor_parallel")


def test_fsdp2_training_step_equals_one_process():
    proc = launch(2, "fsdp2")
    assert_ok(proc, 2, "fsdp2")


def test_peer_that_never_joins_times_out_with_an_error():
    code = """
        import datetime, os, time
        import torch, torch.distributed as dist
        import socket
        with socket.socket() as s:  # a free port, not a fixed one another job may hold
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="2")
        start = time.time()
        try:
            dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=3))
        except Exception as err:
            print("ERROR", type(err).__name__, round(time.time() - start))
    """
    proc = run_python(code, env={"HF_TPU_EMULATE": "1"}, timeout=120)  # the timeout is the bound: no hang
    assert "ERROR" in proc.stdout, proc.stderr[-2000:]


def test_backends_registered_for_the_tpu_device():
    import torch.distributed as dist

    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert {"tpu_dist", "tpu"} <= set(dist.Backend.backend_list)


def test_set_tpu_launch_env_never_overwrites(monkeypatch):
    import torch

    monkeypatch.setattr(os, "environ", os.environ.copy())  # everything it sets goes away afterwards
    monkeypatch.setenv("TORCH_TPU_TOPOLOGY", "keep")
    monkeypatch.delenv("TORCH_TPU_SLICEBUILDER_ADDRESSES", raising=False)
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=4)
    assert os.environ["TORCH_TPU_TOPOLOGY"] == "keep"
    assert len(os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")) == 4
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    with pytest.raises(ValueError, match="NODE_RANK"):  # multi-host needs to know which host this is, as TorchTPU
        torch.tpu.distributed.set_tpu_launch_env(nnodes=2)
