"""``hf-tpu``: run a script on n (emulated) TPU chips of this host, build the emulator core.

hf-tpu launch -n 4 train.py --lr 1e-4   # torchrun --standalone, one process per chip
hf-tpu gaps                              # probe TorchTPU's known gaps here, and what hf-tpu closes
hf-tpu gaps --show cholesky              # a gap's standalone repro, for a TorchTPU bug report
hf-tpu gaps --fixes                      # every patch and workaround hf-tpu applies, and why
hf-tpu build                             # compile the emulator's C++ core ahead of time
hf-tpu env [--json]                      # versions, chips, backend, settings, fixes: paste into a bug report
hf-tpu info                              # which TPU this process would use
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _die_with_parent() -> None:
    """In the torchrun child: get SIGTERM if ``hf-tpu launch`` dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _end_group(pgid: int, grace: float = 10.0) -> None:
    """Stop every process of the launch (torchrun and its ranks): SIGTERM, then SIGKILL after ``grace`` s."""
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


def _launch(args: argparse.Namespace) -> int:
    """torchrun in its own process group: signals reach every rank, and no rank outlives the launch."""
    from ._backend import real_tpu_present

    env = dict(os.environ)
    if not real_tpu_present():
        env.setdefault("HF_TPU_EMULATE", "1")
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
    proc = subprocess.Popen([*cmd, args.script, *args.script_args], env=env, start_new_session=True,
                            preexec_fn=_die_with_parent)  # fmt: skip

    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _end_group(proc.pid, grace=0.0 if proc.poll() is not None else 10.0)
    if returncode == 0:
        return 0
    if received:
        name = signal.Signals(received[0]).name
        sys.stderr.write(f"hf-tpu launch: stopped by {name} (forwarded to torchrun and every rank).\n")
        return 128 + received[0]
    if returncode < 0:
        why = f"was stopped by signal {signal.Signals(-returncode).name}"
    else:
        why = f"exited with status {returncode}: a rank failed (torchrun's report above names the rank and its error)"
    sys.stderr.write(f"hf-tpu launch: {args.script} on {args.nproc} chip(s) {why}.\n")
    return returncode if returncode > 0 else 128 - returncode


def main(argv: list[str] | None = None) -> int:
    import hf_tpu

    parser = argparse.ArgumentParser(prog="hf-tpu", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hf-tpu {hf_tpu.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="run a script on N chips (emulated when no TPU is present)")
    launch.add_argument("-n", "--nproc", type=int, required=True, help="number of chips (one process each)")
    launch.add_argument("script")
    launch.add_argument("script_args", nargs=argparse.REMAINDER)
    gaps = sub.add_parser("gaps", help="probe the TPU backend's known gaps (each in its own process)")
    from .gaps import BY_NAME

    gaps.add_argument("--show", choices=sorted(BY_NAME), help="print a gap's standalone probe and exit")
    gaps.add_argument("--only", nargs="+", choices=sorted(BY_NAME), metavar="GAP", help="probe just these gaps")
    gaps.add_argument("--chips", type=int, help="emulated TPU: chips on the emulated host (multi-chip gaps need 2+)")
    gaps.add_argument("--jobs", type=int, help="emulated TPU: probes run side by side (default: CPU count)")
    gaps.add_argument("--timeout", type=float, default=600, help="seconds per probe (default 600)")
    gaps.add_argument("--json", action="store_true", help="print the results as JSON")
    gaps.add_argument("--no-save", action="store_true", help="do not record the measurement for this machine")
    gaps.add_argument("--fixes", action="store_true", help="list hf-tpu's patches and workarounds, and their state")
    sub.add_parser("build", help="build the emulated TPU's C++ core now")
    env = sub.add_parser("env", help="versions, chips, backend, settings and fixes, for a bug report")
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    sub.add_parser("info", help="print which TPU this process uses")
    chk = sub.add_parser("check", help="whether a model fits a TPU slice, its plan, speed bounds and risks (offline)")
    chk.add_argument("model", help="a local checkpoint directory, or a Hub id whose config is cached")
    from .check import CHIPS, DTYPE_BYTES

    chk.add_argument("--chip", default="v6e", choices=sorted(CHIPS))
    chk.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    chk.add_argument("--batch", type=int, default=1)
    chk.add_argument("--context", type=int, default=4096)
    chk.add_argument("--json", action="store_true", help="print the report as JSON (one schema: hf_tpu.check.Report)")
    chk.add_argument("--run", action="store_true", help="also run a shrunk random copy on the (emulated) TPU")
    args = parser.parse_args(argv)
    if args.command == "check":
        from . import check

        try:
            from .check_run_diffusers import is_diffusers_model

            if os.path.isfile(os.path.join(args.model, "model_index.json")) or is_diffusers_model(args.model):
                pipe = check.check_pipeline(args.model, chip=args.chip, run=args.run)  # a diffusers pipeline or model
                sys.stdout.write((pipe.to_json() if args.json else check.format_pipeline(pipe)) + "\n")
                return 0
            report = check.check(
                args.model, chip=args.chip, dtype=args.dtype, batch=args.batch, context=args.context, run=args.run
            )
        except (OSError, ValueError) as err:
            sys.stderr.write(f"hf-tpu check: {err}\n")
            return 2
        sys.stdout.write((report.to_json() if args.json else check.format_text(report)) + "\n")
        return 0
    if args.command == "launch":
        if args.nproc < 1:
            parser.error(f"-n/--nproc must be at least 1, got {args.nproc}")
        return _launch(args)
    if args.command == "gaps":
        if args.chips is not None and args.chips < 1:
            parser.error(f"--chips must be at least 1, got {args.chips}")
        from .gaps import runner

        return runner.main(args)
    if args.command == "build":
        from . import emulator
        from .emulator._build import CoreBuildError

        try:
            sys.stdout.write(f"hf-tpu: core built in {emulator.build()}\n")
        except CoreBuildError as err:
            sys.stderr.write(f"{err}\n")
            return 1
        return 0
    if args.command == "env":
        import json

        from . import env_report

        report = env_report.collect()
        sys.stdout.write((json.dumps(report, indent=2) if args.json else env_report.format_text(report)) + "\n")
        return 0
    import importlib.util

    import torch  # noqa: F401  (sets the device up as the user's process would: real TPU, or the emulator)

    from ._backend import real_tpu_present

    sys.stdout.write(f"hf-tpu {hf_tpu.__version__}: backend {hf_tpu.backend()}\n")
    if importlib.util.find_spec("torch_tpu") is not None and not real_tpu_present():
        sys.stdout.write(
            "note: torch-tpu is installed but no TPU chip is attached. torch-tpu registers the 'tpu' device during "
            "`import torch` (without libtpu it ends the import with exit status 1), so the emulated TPU cannot run in "
            "this environment: use one without torch-tpu for emulation.\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
