"""The ``"tpu_dist"`` (and ``"tpu"``) process-group backend of the emulated TPU.

Collectives run with gloo on zero-copy CPU aliases of the device tensors, so results land
in device memory without copies, and gloo's timeouts turn a missing peer into an error
instead of a hang. One process per chip: every rank sees ``tpu:0``, as on TorchTPU.
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
import weakref
from typing import Any

import torch
import torch.distributed as dist

from hf_tpu import settings
from hf_tpu.emulator import _build

BACKEND_NAMES = ("tpu_dist", "tpu")


_live: weakref.WeakSet[TpuProcessGroup] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    # A gloo backend destroyed during interpreter teardown can abort the process with its
    # threads still running; shut down whatever the program did not destroy.
    for pg in list(_live):
        pg.shutdown()


def _alias(x: Any) -> Any:
    """Tensors (and nested lists of them) on tpu -> CPU aliases over the same memory."""
    if isinstance(x, torch.Tensor):
        return _build.load().cpu_alias(x) if x.device.type == "tpu" else x
    if isinstance(x, list):
        return [_alias(v) for v in x]
    return x


class _NamedWork(dist.Work):
    """gloo's Work(s) behind one Work whose failure names the hosts that are gone.

    Not ``_create_work_from_future``: the Work it makes returns True from ``wait()`` when the future failed, so a
    collective with a dead peer would pass silently with its output untouched."""

    def __init__(self, works: list[Any], explain: Any) -> None:
        super().__init__()
        self._works = works
        self._explain = explain

    def wait(self, timeout: Any = None) -> bool:
        for work in self._works:
            try:
                work.wait() if timeout is None else work.wait(timeout)
            except RuntimeError as err:
                if self._explain is None:
                    raise
                raise RuntimeError(self._explain(err)) from err
        return True

    def get_future(self) -> torch.futures.Future:
        if len(self._works) == 1:
            return self._works[0].get_future()
        return torch.futures.collect_all([w.get_future() for w in self._works])


class TpuProcessGroup(dist.ProcessGroup):
    """A process group for ``"tpu"`` tensors (CPU tensors work too), backed by gloo."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        _join(store, rank, size, min(timeout, join_timeout()))
        self._where = _where_everyone_is(store, rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._timeout = timeout
        _live.add(self)

    def shutdown(self) -> None:
        """Stop gloo's threads now (destroy_process_group calls this), not during interpreter teardown."""
        gloo, self._gloo = self._gloo, None
        if gloo is not None:
            gloo.shutdown()
            _live.discard(self)

    def abort(self) -> None:
        gloo, self._gloo = self._gloo, None
        if gloo is not None:
            gloo.abort()
            _live.discard(self)

    def getBackendName(self) -> str:  # noqa: N802  (c10d's name)
        return "tpu_dist"

    @property
    def group_name(self) -> str:
        # A Python process group keeps its registered name in c10d's world table.
        return dist.distributed_c10d._world.pg_names[self]

    def _call(self, name: str, *args: Any) -> Any:
        if self._gloo is None:
            raise RuntimeError("This tpu_dist process group was shut down (destroy_process_group was called).")
        try:
            work = getattr(self._gloo, name)(*(_alias(a) for a in args))
        except RuntimeError as err:
            raise RuntimeError(self._explain(name, err)) from err
        return work if self.size() == 1 else _NamedWork([work], lambda err: self._explain(name, err))

    def _explain(self, op: str, err: BaseException) -> str:
        """A failed collective's error, naming the hosts whose ranks are gone (or every host, when unsure)."""
        gone = [r for r, info in enumerate(self._where) if r != self.rank() and not _alive(info)]
        if gone:
            hosts = sorted({self._where[r]["host"] for r in gone})
            ranks = ", ".join(str(r) for r in gone)
            what = f"rank(s) {ranks} of this group are gone, on host(s) {', '.join(repr(h) for h in hosts)}"
        else:
            hosts = sorted({info["host"] for info in self._where})
            what = f"no peer is known dead; this group spans host(s) {', '.join(repr(h) for h in hosts)}"
        timeout = self._timeout.total_seconds()
        return f"tpu_dist: {op} on rank {self.rank()} of {self.size()} failed: {what}. (gloo: {str(err).strip()[:300]}; collective timeout {timeout:.0f} s)"

    def _all(self, works: list[Any]) -> Any:
        """One Work that completes when all of ``works`` have (and fails when one does)."""
        return _NamedWork(works, None)

    # The collectives of c10d's Python ProcessGroup API, each on gloo with tensors aliased.
    def allreduce(self, tensors, opts=None):
        return self._call("allreduce", tensors, opts or dist.AllreduceOptions())

    def allreduce_coalesced(self, tensors, opts=None):
        return self._call("allreduce_coalesced", tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors, opts=None):
        return self._call("reduce", tensors, opts or dist.ReduceOptions())

    def broadcast(self, tensors, opts=None):
        return self._call("broadcast", tensors, opts or dist.BroadcastOptions())

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._call("allgather", output_tensors, input_tensors, opts or dist.AllgatherOptions())

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._call("allgather_coalesced", output_lists, input_list, opts or dist.AllgatherOptions())

    def all_gather_single(self, output, input, opts=None):
        return self._call("_allgather_base", output, input, opts or dist.AllgatherOptions())

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._all([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        return self._call("gather", output_tensors, input_tensors, opts or dist.GatherOptions())

    def scatter(self, output_tensors, input_tensors, opts=None):
        return self._call("scatter", output_tensors, input_tensors, opts or dist.ScatterOptions())

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        return self._call("reduce_scatter", output_tensors, input_tensors, opts or dist.ReduceScatterOptions())

    def reduce_scatter_single(self, output, input, opts=None):
        return self._call("_reduce_scatter_base", output, input, opts or dist.ReduceScatterOptions())

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._all([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._call(
            "alltoall_base", output, input, output_split_sizes, input_split_sizes, opts or dist.AllToAllOptions()
        )

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._call("alltoall", output_tensors, input_tensors, opts or dist.AllToAllOptions())

    def barrier(self, opts=None):
        opts = opts or dist.BarrierOptions()
        opts.device_ids = []  # a device index means nothing to gloo; every rank is tpu:0 anyway
        return self._call("barrier", opts)

    def send(self, tensors, dst, tag=0):
        return self._call("send", tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        return self._call("recv", tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._call("recv_anysource", tensors, tag)


def join_timeout() -> datetime.timedelta:
    """How long ranks wait for each other to create a group: ``HF_TPU_JOIN_TIMEOUT`` seconds (default 300).

    Separate from the collectives' timeout, which callers set long on purpose (transformers uses 2 h because
    sharded loading skews ranks): a rank that never starts must not hold the others for hours.
    """
    return datetime.timedelta(seconds=settings.get("HF_TPU_JOIN_TIMEOUT"))


def _join(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Every rank checks in; on timeout, the error names the ranks that never did."""
    if size == 1:
        return
    store.set(f"hf_tpu_join/{rank}", "1")
    keys = [f"hf_tpu_join/{r}" for r in range(size)]
    try:
        store.wait(keys, timeout)
    except Exception as err:  # noqa: BLE001  (c10d raises DistStoreError / RuntimeError by version)
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        raise RuntimeError(
            f"tpu_dist: rank {rank} waited {timeout.total_seconds():.0f} s, but rank(s) {missing} of {size} never "
            "joined the process group (crashed or still starting?). Set HF_TPU_JOIN_TIMEOUT to wait longer."
        ) from err


def _where_everyone_is(store: dist.Store, rank: int, size: int) -> list[dict[str, Any]]:
    """Each rank's host (the emulated host's name), machine and pid, published through the group's store."""
    import json

    mine = {"host": settings.text("HF_TPU_EMULATOR_HOST") or socket.gethostname(), "machine": socket.gethostname(),
            "pid": os.getpid()}  # fmt: skip
    if size == 1:
        return [mine]
    store.set(f"hf_tpu_where/{rank}", json.dumps(mine))
    return [json.loads(store.get(f"hf_tpu_where/{r}")) for r in range(size)]


def _alive(info: dict[str, Any]) -> bool:
    """Whether a peer's process still runs (known only for peers on this machine: emulated hosts)."""
    if info.get("machine") != socket.gethostname():
        return True
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed process its parent has not reaped yet is a zombie: gone all the same
        with open(f"/proc/{int(info['pid'])}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def _create_process_group(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> TpuProcessGroup:
    return TpuProcessGroup(store, rank, size, timeout)


def register() -> None:
    """Register ``"tpu_dist"`` and ``"tpu"`` for device ``"tpu"``, and make ``"tpu_dist"`` its default."""
    if not dist.is_available():
        return
    for name in BACKEND_NAMES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _create_process_group, devices=["tpu"])
    dist.Backend.default_device_backend_map["tpu"] = "tpu_dist"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set the launch variables every rank must share (never overwriting ones already set), as TorchTPU does.

    One host: ``localhost:<free port>`` per chip and a ``1,N,1`` topology (the emulator has no PCI table).
    Several (``nnodes > 1``, two or more ``TPU_WORKER_HOSTNAMES``, or ``JOB_COMPLETION_INDEX``): one address
    ``<host>:<TORCH_TPU_BASE_PORT + i>`` per chip of every host, ``NNODES`` from the hostnames, ``NODE_RANK``
    from the chips' coordinates when ``TORCH_TPU_TOPOLOGY`` describes the slice (an emulated host's index),
    else ``JOB_COMPLETION_INDEX``; ``MASTER_ADDR`` the first host, ``MASTER_PORT`` 29500.
    """
    import time

    os.environ.setdefault("TORCH_TPU_XPROF_SESSION_ID", str(time.time_ns()))
    listed = settings.text("TPU_WORKER_HOSTNAMES") or ""
    hosts = [h for h in listed.split(",") if h]
    if nnodes is not None and hosts and nnodes != len(hosts):
        raise ValueError(
            "set_tpu_launch_env(): expected nnodes to match the number of hosts in environment variable "
            f'TPU_WORKER_HOSTNAMES ({len(hosts)}: "{listed}"), got {nnodes}'
        )
    completion_index = settings.text("JOB_COMPLETION_INDEX")
    if not ((nnodes or 1) > 1 or len(hosts) > 1 or completion_index is not None):
        n = int(nproc_per_node or settings.text("WORLD_SIZE") or 1)
        os.environ.setdefault(
            "TORCH_TPU_SLICEBUILDER_ADDRESSES", ",".join(f"localhost:{_free_port()}" for _ in range(n))
        )
        os.environ.setdefault("TORCH_TPU_TOPOLOGY", f"1,{n},1")
        return

    def require_hosts() -> list[str]:
        if not hosts:
            raise ValueError(
                "set_tpu_launch_env(): expected environment variable TPU_WORKER_HOSTNAMES to be a comma-separated "
                "list of worker hostnames or IP addresses, got it as unset"
            )
        return hosts

    slice_topology = settings.text("TORCH_TPU_TOPOLOGY")
    if settings.text("TORCH_TPU_SLICEBUILDER_ADDRESSES") is None:
        base = int(settings.text("TORCH_TPU_BASE_PORT") or "8070")
        per_host = int(settings.text("TORCH_TPU_DEVICES_PER_HOST") or nproc_per_node or 8)
        os.environ["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = ",".join(
            f"{host}:{base + i}" for host in require_hosts() for i in range(per_host)
        )
    if settings.text("NNODES") is None:
        os.environ["NNODES"] = str(nnodes if nnodes is not None else len(require_hosts()))
    if settings.text("NODE_RANK") is None:
        index = settings.text("HF_TPU_EMULATOR_HOST_INDEX")  # what the emulated chips' coordinates say
        if slice_topology and index is not None:
            os.environ["NODE_RANK"] = index
        elif completion_index is not None:
            os.environ["NODE_RANK"] = completion_index
        else:
            raise ValueError(
                "set_tpu_launch_env(): expected the slice's topology with environment variable TORCH_TPU_TOPOLOGY, "
                "or environment variable JOB_COMPLETION_INDEX, to derive NODE_RANK, got neither"
            )
    os.environ.setdefault("MASTER_ADDR", require_hosts()[0])
    os.environ.setdefault("MASTER_PORT", "29500")
