"""``hf-tpu``: run a script on n (emulated) TPU chips of this host, build the emulator core.

hf-tpu launch -n 4 train.py --lr 1e-4   # torchrun --standalone, one process per chip
hf-tpu launch -n 8 --nnodes 4 train.py   # on every host of a 4-host slice: torchrun's c10d rendezvous
hf-tpu launch --emulate-hosts 2 -n 2 train.py   # 2 emulated hosts x 2 chips on this machine
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
import sys


def main(argv: list[str] | None = None) -> int:
    import hf_tpu

    parser = argparse.ArgumentParser(prog="hf-tpu", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hf-tpu {hf_tpu.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
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
        from . import launch as launching

        for flag, value, least in (("-n/--nproc", args.nproc, 1), ("--nnodes", args.nnodes, 1),
                                   ("--max-restarts", args.max_restarts, 0), ("--emulate-hosts", args.emulate_hosts, 1),
                                   ("--emulate-slices", args.emulate_slices, 1)):  # fmt: skip
            if value is not None and value < least:
                parser.error(f"{flag} must be at least {least}, got {value}")
        if args.emulate_slices is not None and args.emulate_hosts is None:
            parser.error("--emulate-slices needs --emulate-hosts")
        if args.emulate_hosts is not None and (args.nnodes or args.rdzv_endpoint):
            parser.error("--emulate-hosts runs every host here: leave out --nnodes and --rdzv-endpoint")
        job = launching.Launch(args.script, tuple(args.script_args), args.nproc, args.nnodes, args.rdzv_endpoint,
                               args.rdzv_id, args.max_restarts, args.join_timeout, args.host_timeout)  # fmt: skip
        try:
            if args.emulate_hosts is not None:
                return launching.run_emulated_hosts(job, args.emulate_hosts, args.emulate_slices)
            return launching.run_host(job)
        except (ValueError, RuntimeError) as err:
            sys.stderr.write(f"hf-tpu launch: {err}\n")
            return 2
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
