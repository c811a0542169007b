"""The multi-host parts that need no second host: the emulated slice's layout, the launch environment, the
launcher's command line and errors, a dead peer named. The launches themselves are tests/multihost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hf_tpu.collectives import CollectiveCounts
from hf_tpu.commands import launch
from hf_tpu.emulator.topology import Chip, rank_layout
from tests.conftest import run_python


def chips(hosts: int, per_host: int, slices: bool, order: list[int] | None = None) -> list[Chip]:
    """Ranks as a c10d rendezvous may hand them out: host order ``order`` (default 0, 1, ...)."""
    order = order or list(range(hosts))
    return [
        Chip(rank, host if slices else None, host, chip)
        for rank, (host, chip) in enumerate((h, c) for h in order for c in range(per_host))
    ]


def test_one_slice_follows_host_then_chip_order():
    layout = rank_layout(chips(2, 2, slices=False, order=[1, 0]), (2, 2))
    assert layout.tolist() == [[2, 3], [0, 1]] and layout.dtype == torch.int64  # host 0's chips first


def test_slices_split_the_outermost_axis_over_dcn():
    layout = rank_layout(chips(2, 2, slices=True), (1, 2, 1, 2))  # (pp, dp_replicate, fsdp, tp)
    assert layout.reshape(2, 2).tolist() == [[0, 1], [2, 3]]  # tp inside a slice, dp_replicate across
    explicit = rank_layout(chips(2, 2, slices=True), (2, 2), (1, 2))  # the inner axis across: TP over DCN
    assert explicit.tolist() == [[0, 2], [1, 3]]


@pytest.mark.parametrize(
    ("mesh", "dcn", "message"),
    [
        ((4,), (3,), "covers 3 slices, but the job has 2"),
        ((4, 1), (2,), "same number of dimensions"),
        ((3, 4), (2, 1), "outermost|divide"),
        ((1, 1), None, "every axis has extent 1"),
        ((8,), (2,), "has 8 elements but the job has 4"),
    ],
)
def test_bad_multislice_requests_are_clear_errors(mesh, dcn, message):
    with pytest.raises(ValueError, match=message):
        rank_layout(chips(2, 2, slices=True), mesh, dcn)


def test_a_dcn_split_on_one_slice_is_refused():
    with pytest.raises(RuntimeError, match="report no slice index"):
        rank_layout(chips(2, 2, slices=False), (2, 2), (2, 1))


@pytest.mark.emulator_only(
    "an emulated multi-host slice (its host index); TorchTPU reads these variables once per process"
)
def test_set_tpu_launch_env_for_a_multi_host_slice(monkeypatch):
    # the whole environment comes back afterwards (delenv of an unset name would not restore it once set)
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name in ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "JOB_COMPLETION_INDEX", "TORCH_TPU_BASE_PORT", "TORCH_TPU_DEVICES_PER_HOST"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("TORCH_TPU_TOPOLOGY", "2,4,1")
    monkeypatch.setenv("HF_TPU_EMULATOR_HOST_INDEX", "1")
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=2)
    assert os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] == "10.0.0.1:8070,10.0.0.1:8071,10.0.0.2:8070,10.0.0.2:8071"
    assert (os.environ["NNODES"], os.environ["NODE_RANK"]) == ("2", "1")
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.1", "29500")
    with pytest.raises(ValueError, match="expected nnodes to match"):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=3)
    for name in ("NODE_RANK", "TORCH_TPU_TOPOLOGY"):
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX"):  # no topology, no index: TorchTPU's error
        torch.tpu.distributed.set_tpu_launch_env()


def test_torchrun_gets_the_c10d_rendezvous_on_many_hosts():
    job = launch.Launch("train.py", ("--lr", "1"), 4, max_restarts=2, join_timeout=30)
    env = {"NNODES": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCH_TPU_XPROF_SESSION_ID": "7"}
    cmd = launch.torchrun_command(job, env)
    assert cmd[cmd.index("--nproc-per-node=4") :] == [
        "--nproc-per-node=4", "--max-restarts=2", "--nnodes=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29500", "--rdzv-id=7", "--rdzv-conf=join_timeout=30", "train.py", "--lr", "1",
    ]  # fmt: skip
    assert "--standalone" in launch.torchrun_command(job, {})
    envs = launch.emulated_host_envs(4, 2, 2, base={})
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == ["0", "0", "1", "1"]
    assert len({e["HF_TPU_EMULATOR_HOST"] for e in envs}) == 4 and {e["MASTER_PORT"] for e in envs} == {
        envs[0]["MASTER_PORT"]
    }


def test_restarts_get_a_rendezvous_store_per_attempt():
    # torchrun shares one store across attempts: a restarted rank could dial a dead rank's address (#135712)
    def store_setting(restarts: int, base: dict[str, str]) -> str | None:
        return launch.host_env(launch.Launch("x.py", (), 2, max_restarts=restarts), base=base).get(
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
        )

    assert store_setting(1, {}) == "1"
    assert store_setting(0, {}) is None
    assert store_setting(1, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}) == "0"  # the user's choice is kept


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--emulate-slices", "2"], {}, "--emulate-slices needs --emulate-hosts"),
        (["--emulate-hosts", "3", "--emulate-slices", "2"], {}, "must divide --emulate-hosts 3"),
        (["--emulate-hosts", "2", "--nnodes", "2"], {}, "leave out --nnodes"),
        (["--nnodes", "3"], {"TPU_WORKER_HOSTNAMES": "a,b"}, "--nnodes 3, but TPU_WORKER_HOSTNAMES lists 2 hosts"),
        (["--max-restarts", "-1"], {}, "--max-restarts must be at least 0"),
    ],
)
def test_bad_launch_arguments_name_the_flag(args, env, message):
    proc = subprocess.run(
        [sys.executable, "-m", "hf_tpu", "launch", "-n", "2", *args, "x.py"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_collective_counts_split_by_link():
    counts = CollectiveCounts([0, 0, 1, 1])
    counts.add("all_reduce", [0, 1], 100)
    counts.add("all_reduce", [0, 2], 40)
    assert (counts.ici_bytes, counts.dcn_bytes) == (100, 40)
    assert "all_reduce               DCN  group of 2       1 calls             40 bytes" in counts.summary()


def test_a_collective_whose_peer_died_raises_naming_it(tmp_path):
    """Not a silent pass: a Work made from a future would return from wait() with the output untouched."""
    script = tmp_path / "dead_peer.py"
    script.write_text(
        "import os, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('tpu_dist')\n"
        "x = torch.ones(4, device='tpu')\n"
        "dist.all_reduce(x)\n"
        "if dist.get_rank() == 1:\n"
        "    os._exit(0)\n"
        "time.sleep(1)\n"
        "try:\n"
        "    dist.all_reduce(x)\n"
        "    print('NO ERROR', x.cpu().tolist())\n"
        "except RuntimeError as err:\n"
        "    print('RAISED', err)\n"
    )
    proc = run_python(
        f"import sys; sys.argv = ['hf-tpu', 'launch', '-n', '2', {str(script)!r}]\n"
        "from hf_tpu.commands import main\nraise SystemExit(main(sys.argv[1:]))",
        env={},
        timeout=300,
    )
    assert "NO ERROR" not in proc.stdout and "RAISED tpu_dist: allreduce on rank 0 of 2 failed" in proc.stdout, (
        proc.stdout[-2000:] + proc.stderr[-2000:]
    )
    assert "rank(s) 1 of this group are gone" in proc.stdout or "no peer is known dead" in proc.stdout
