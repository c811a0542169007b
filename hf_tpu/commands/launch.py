"""``hf-tpu launch``: torchrun, one process per chip, on one host, on many (c10d rendezvous), or on emulated hosts.

One host: ``torchrun --standalone``. Several hosts (a multi-host slice, or slices joined over DCN): the same
command on every host, on top of torchrun's c10d rendezvous; the launch environment TorchTPU needs on each host
comes from ``python -m torch.tpu.distributed`` (``set_tpu_launch_env``), which reads the Cloud TPU VM's own
variables (``TPU_WORKER_HOSTNAMES``, ...). ``--emulate-hosts H`` runs H emulated hosts on this machine, each an
``hf-tpu launch`` of its own joining one rendezvous on 127.0.0.1, so the multi-host path runs without a pod.

The launcher never leaves a process behind: torchrun runs in its own process group, signals are forwarded to
every rank, and a host that ends badly ends the job with its name (``--host-timeout`` bounds the wait for the
others).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# What TorchTPU's launch environment may set and torchrun's ranks must see (python -m torch.tpu.distributed).
_LAUNCH_VARIABLES = ("TORCH_TPU_TOPOLOGY", "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_XPROF_SESSION_ID",
                     "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """What ``hf-tpu launch`` was asked to run."""

    script: str
    script_args: tuple[str, ...]
    nproc: int  # chips (ranks) per host
    nnodes: int | None = None  # hosts; None: one, or what the TPU VM's environment says
    rdzv_endpoint: str | None = None  # HOST:PORT of the rendezvous; default MASTER_ADDR:MASTER_PORT
    rdzv_id: str | None = None
    max_restarts: int = 0
    join_timeout: float = 600.0  # seconds every host has to join the rendezvous
    host_timeout: float = 60.0  # emulated hosts: seconds the others have to end after one failed


def _die_with_parent() -> None:
    """In the torchrun child: get SIGTERM if ``hf-tpu launch`` dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def end_group(pgid: int, grace: float = 10.0) -> None:
    """Stop every process of a group (torchrun and its ranks): SIGTERM, then SIGKILL after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hostnames(env: dict[str, str]) -> list[str]:
    return [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]


def tpu_launch_env(env: dict[str, str], timeout: float = 300.0) -> dict[str, str]:
    """The launch variables ``python -m torch.tpu.distributed`` decides for this host (never overriding ``env``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.tpu.distributed"], env=env, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(
            "hf-tpu launch: `python -m torch.tpu.distributed` could not set the launch environment "
            f"(exit {proc.returncode}): {proc.stderr.strip()[-1500:]}"
        )
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in _LAUNCH_VARIABLES:
            parts = shlex.split(value)
            found[key] = parts[0] if parts else ""
    return {k: v for k, v in found.items() if k not in env}


def torchrun_command(launch: Launch, env: dict[str, str]) -> list[str]:
    """torchrun's command line for this host."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={launch.nproc}"]
    cmd.append(f"--max-restarts={launch.max_restarts}")
    nnodes = int(env.get("NNODES", launch.nnodes or 1))
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        endpoint = launch.rdzv_endpoint or f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '29500')}"
        rdzv_id = launch.rdzv_id or env.get("TORCH_TPU_XPROF_SESSION_ID") or "hf-tpu"
        conf = f"join_timeout={launch.join_timeout:g}"
        if env.get("HF_TPU_RDZV_IS_HOST"):  # emulated hosts share 127.0.0.1: host 0 keeps the store, as a VM's host 0
            conf += f",is_host={env['HF_TPU_RDZV_IS_HOST']}"
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--rdzv-conf={conf}"]  # fmt: skip
    return [*cmd, launch.script, *launch.script_args]


def _refuse_mixed_switches() -> None:
    """HF_TPU_XLA_CPU=1 with HF_TPU_EMULATE=1: say so before asking TorchTPU for a launch environment, whose own
    error ("expected TPU devices, got none") would not name the switches."""
    from hf_tpu import xla_cpu

    if xla_cpu.requested():
        try:
            xla_cpu._check_alone()
        except xla_cpu.XlaCpuSetupError as err:
            raise ValueError(str(err)) from None


def host_env(launch: Launch, base: dict[str, str] | None = None) -> dict[str, str]:
    """This host's environment for torchrun: emulation when no TPU (real, or the real wheel on XLA:CPU) is present,
    and the multi-host variables."""
    from hf_tpu.plumbing.backend import needs_emulator

    env = dict(os.environ if base is None else base)
    _refuse_mixed_switches()
    if needs_emulator():
        from hf_tpu import settings

        if env.get("HF_TPU_EMULATE", "").strip():
            try:
                emulate = settings.get("HF_TPU_EMULATE")
            except settings.EnvError as err:
                raise ValueError(str(err)) from None
            if not emulate:
                raise ValueError(
                    "this machine has no TPU (and HF_TPU_XLA_CPU is not set), and HF_TPU_EMULATE=0 turns the emulated "
                    "TPU off, so the ranks would have no device: unset HF_TPU_EMULATE (the launch emulates the chips) "
                    "or run on a TPU VM."
                )
        env["HF_TPU_EMULATE"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // launch.nproc)))
    if launch.max_restarts > 0:
        # torchrun's agent keeps one TCPStore for every attempt, so a restarted rank can read a dead rank's
        # address from the attempt before and fail to connect (pytorch/pytorch#135712, still so in 2.13):
        # one store per attempt, held by rank 0, as torchrun did before it shared the agent's
        env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    hosts = _hostnames(env)
    if launch.nnodes is not None and hosts and len(hosts) != launch.nnodes:
        raise ValueError(
            f"--nnodes {launch.nnodes}, but TPU_WORKER_HOSTNAMES lists {len(hosts)} hosts ({','.join(hosts)}): "
            "pass the number of hosts of the slice, or leave --nnodes out to take it from the VM."
        )
    multihost = (launch.nnodes or 1) > 1 or len(hosts) > 1
    if multihost:
        if launch.rdzv_endpoint and "MASTER_ADDR" not in env:
            host, _, port = launch.rdzv_endpoint.rpartition(":")
            env.setdefault("MASTER_ADDR", host)
            env.setdefault("MASTER_PORT", port)
        if launch.nnodes and not hosts:
            # no VM list (a cluster of our own): the rendezvous decides who is who; TorchTPU wants some names
            env["TPU_WORKER_HOSTNAMES"] = ",".join([env.get("MASTER_ADDR", "localhost")] * launch.nnodes)
    if multihost or not needs_emulator():
        # TorchTPU's tpu_dist process group reads TORCH_TPU_TOPOLOGY and TORCH_TPU_SLICEBUILDER_ADDRESSES, which
        # torchrun does not set: one host of real chips needs them too (the emulated one does not)
        env.update(tpu_launch_env(env))
    return env


def _forwarding(procs: list[subprocess.Popen]) -> tuple[list[int], dict]:
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for proc in procs:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

    return received, {sig: signal.signal(sig, forward) for sig in _FORWARDED}


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)


def run_host(launch: Launch) -> int:
    """One host: torchrun in its own process group; signals reach every rank, and no rank outlives the launch."""
    env = host_env(launch)
    proc = _start(torchrun_command(launch, env), env)
    received, previous = _forwarding([proc])
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        end_group(proc.pid, grace=0.0 if proc.poll() is not None else 10.0)
    if returncode == 0:
        return 0
    if received:
        name = signal.Signals(received[0]).name
        sys.stderr.write(f"hf-tpu launch: stopped by {name} (forwarded to torchrun and every rank).\n")
        return 128 + received[0]
    where = f"on {launch.nproc} chip(s)"
    if int(env.get("NNODES", "1")) > 1:
        where += f" of host {env.get('NODE_RANK', '?')} ({env.get('HF_TPU_EMULATOR_HOST') or socket.gethostname()})"
    if returncode < 0:
        why = f"was stopped by signal {signal.Signals(-returncode).name}"
    else:
        why = f"exited with status {returncode}: a rank failed (torchrun's report above names the rank and its error)"
    sys.stderr.write(f"hf-tpu launch: {launch.script} {where} {why}.\n")
    return returncode if returncode > 0 else 128 - returncode


def emulated_host_envs(hosts: int, slices: int, nproc: int, base: dict[str, str] | None = None) -> list[dict[str, str]]:
    """The environment of each emulated host: its own chips, its worker id, and its slice (over DCN)."""
    if hosts < 1 or slices < 1 or hosts % slices:
        raise ValueError(f"--emulate-slices {slices} must divide --emulate-hosts {hosts} (both at least 1).")
    env = dict(os.environ if base is None else base)
    stem = env.get("HF_TPU_EMULATOR_HOST") or f"{socket.gethostname()}-{os.getpid()}"
    port = free_port()
    common = {
        "HF_TPU_EMULATE": "1",
        "HF_TPU_EMULATOR_CHIPS": env.get("HF_TPU_EMULATOR_CHIPS", str(nproc)),
        "HF_TPU_EMULATOR_HOSTS": str(hosts),
        "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * hosts),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCH_TPU_XPROF_SESSION_ID": str(time.time_ns()),
    }
    if slices > 1:  # multislice: the variables libtpu's MegaScale client reads
        common.update(MEGASCALE_NUM_SLICES=str(slices), MEGASCALE_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}")
    per_slice = hosts // slices
    envs = []
    for i in range(hosts):
        host = {**env, **common, "HF_TPU_EMULATOR_HOST": f"{stem}-host{i}", "TPU_WORKER_ID": str(i)}
        host["HF_TPU_EMULATOR_HOST_INDEX"] = str(i)
        host["HF_TPU_RDZV_IS_HOST"] = "true" if i == 0 else "false"
        host.setdefault("TORCH_TPU_TOPOLOGY", f"1,{nproc * per_slice},1")  # the slice's: hosts rank by it
        if slices > 1:
            host["MEGASCALE_SLICE_ID"] = str(i // per_slice)
        envs.append(host)
    return envs


def run_emulated_hosts(launch: Launch, hosts: int, slices: int | None = None) -> int:
    """H emulated hosts on this machine, each its own ``hf-tpu launch`` joining one c10d rendezvous."""
    slices = hosts if slices is None else slices
    envs = emulated_host_envs(hosts, slices, launch.nproc)
    rdzv_id = launch.rdzv_id or f"hf-tpu-emulated-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "hf_tpu", "launch", "-n", str(launch.nproc), "--nnodes", str(hosts),
           "--rdzv-id", rdzv_id, "--max-restarts", str(launch.max_restarts),
           "--join-timeout", f"{launch.join_timeout:g}", launch.script, *launch.script_args]  # fmt: skip
    sys.stderr.write(
        f"hf-tpu launch: {hosts} emulated hosts x {launch.nproc} chips ({slices} slice(s) over DCN), "
        f"rendezvous 127.0.0.1:{envs[0]['MASTER_PORT']}\n"
    )
    procs = [_start(cmd, env) for env in envs]
    names = [env["HF_TPU_EMULATOR_HOST"] for env in envs]
    received, previous = _forwarding(procs)
    failed: tuple[int, int] | None = None
    deadline: float | None = None
    try:
        while [p.poll() for p in procs].count(None):  # poll every host (any() would stop at the first alive)
            if failed is None:
                # a host killed by a signal is the cause; the others fail after it (by signal first, then index)
                ended = sorted((p.returncode >= 0, i) for i, p in enumerate(procs) if p.returncode not in (None, 0))
                failed = (ended[0][1], procs[ended[0][1]].returncode) if ended else None
                if failed is not None:
                    deadline = time.monotonic() + launch.host_timeout
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for p in procs:
            end_group(p.pid, grace=0.0 if p.poll() is not None else 10.0)
    codes = [p.wait() for p in procs]
    if received:
        return 128 + received[0]
    if failed is None:
        failed = next(((i, c) for i, c in enumerate(codes) if c != 0), None)
    if failed is None:
        return 0
    index, code = failed
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    others = ", ".join(f"host {i}: {_status(c)}" for i, c in enumerate(codes) if i != index)
    sys.stderr.write(
        f"hf-tpu launch: emulated host {index} ({names[index]!r}) {how}; the job ended with it ({others}; "
        f"--host-timeout {launch.host_timeout:g} s).\n"
    )
    return code if code > 0 else 128 - code


def _status(code: int) -> str:
    return "ok" if code == 0 else (f"killed by {signal.Signals(-code).name}" if code < 0 else f"status {code}")


def register(sub: argparse._SubParsersAction) -> None:
    launch = sub.add_parser("launch", help="run a script on N chips per host (emulated when no TPU is present)")
    launch.add_argument("-n", "--nproc", type=int, required=True, help="chips per host (one process each)")
    launch.add_argument("--nnodes", type=int, help="hosts (default: TPU_WORKER_HOSTNAMES' count, else 1)")
    launch.add_argument("--rdzv-endpoint", help="HOST:PORT of the rendezvous (default MASTER_ADDR:MASTER_PORT)")
    launch.add_argument("--rdzv-id", help="the job's id, the same on every host")
    launch.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts every rank this often")
    launch.add_argument("--join-timeout", type=float, default=600, help="seconds for every host to join (600)")
    launch.add_argument("--emulate-hosts", type=int, help="run this many emulated hosts on this machine")
    launch.add_argument("--emulate-slices", type=int, help="emulated hosts form this many slices (default: one each)")
    launch.add_argument("--host-timeout", type=float, default=60, help="emulated hosts: seconds the others get to "
                        "end after one failed (60)")  # fmt: skip
    launch.add_argument("script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER)
    launch.set_defaults(command_function=command, usage_error=launch.error)


def command(args: argparse.Namespace) -> int:
    """``hf-tpu launch``: check the flags, then run this host's ranks (or every emulated host's)."""
    for flag, value, least in (("-n/--nproc", args.nproc, 1), ("--nnodes", args.nnodes, 1),
                               ("--max-restarts", args.max_restarts, 0), ("--emulate-hosts", args.emulate_hosts, 1),
                               ("--emulate-slices", args.emulate_slices, 1)):  # fmt: skip
        if value is not None and value < least:
            args.usage_error(f"{flag} must be at least {least}, got {value}")
    if args.emulate_slices is not None and args.emulate_hosts is None:
        args.usage_error("--emulate-slices needs --emulate-hosts")
    if args.emulate_hosts is not None and (args.nnodes or args.rdzv_endpoint):
        args.usage_error("--emulate-hosts runs every host here: leave out --nnodes and --rdzv-endpoint")
    job = Launch(args.script, tuple(args.script_args), args.nproc, args.nnodes, args.rdzv_endpoint, args.rdzv_id,
                 args.max_restarts, args.join_timeout, args.host_timeout)  # fmt: skip
    try:
        if args.emulate_hosts is not None:
            return run_emulated_hosts(job, args.emulate_hosts, args.emulate_slices)
        return run_host(job)
    except (ValueError, RuntimeError) as err:
        sys.stderr.write(f"hf-tpu launch: {err}\n")
        return 2
