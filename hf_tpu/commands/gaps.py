"""``hf-tpu gaps``: run every probe in its own process, with hf-tpu's workarounds off and then on.

Probes run in subprocesses because TorchTPU answers some gaps by aborting the process. With the
workarounds off a probe tells whether the backend has the gap; with them on, whether hf-tpu closes
it. The first result is saved as this machine's measurement (``status.save_measurement``), which
decides from then on which workarounds get installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from hf_tpu import settings
from hf_tpu.gaps import GAPS, get
from hf_tpu.gaps.probes import NOT_APPLICABLE, script

_INTERESTING = ("Error", "error:", "Check failed", "not implemented", "NotImplemented", "Aborted", "aborts")


@dataclass
class Result:
    name: str
    without_workarounds: str  # present | fixed | not seen (an intermittent gap) | n/a | timeout
    with_workarounds: str
    workaround: str | None
    detail: str  # the probe's first complaint, workarounds off


def _outcome(returncode: int | None, intermittent: bool = False) -> str:
    if returncode is None:
        return "timeout"
    if returncode == 0:
        return "not seen" if intermittent else "fixed"
    if returncode == NOT_APPLICABLE:
        return "n/a"
    return "present"


def _detail(stdout: str, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    hit = next((line for line in lines if any(k in line for k in _INTERESTING)), lines[-1] if lines else "")
    if not hit:
        hit = (stdout.strip().splitlines() or [""])[-1]
    return hit[:200]


def _run_probe(name: str, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script(name)], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    return proc.returncode, _detail(proc.stdout, proc.stderr) if proc.returncode else ""


def _environments(name: str, emulated: bool) -> tuple[dict[str, str], dict[str, str]]:
    base = dict(os.environ)
    base.pop("HF_TPU_WORKAROUNDS", None)
    if emulated:
        base["HF_TPU_EMULATE"] = "1"
    off, on = {**base, "HF_TPU_WORKAROUNDS": "0"}, dict(base)
    if emulated:  # each probe its own emulated host, so probes running side by side hold no chip of another's
        host = settings.text("HF_TPU_EMULATOR_HOST") or f"hf-tpu-gaps-{os.getpid()}"
        off["HF_TPU_EMULATOR_HOST"] = f"{host}-{name}-off"
        on["HF_TPU_EMULATOR_HOST"] = f"{host}-{name}-on"
    return off, on


def run(names: list[str] | None = None, *, jobs: int | None = None, timeout: float = 600) -> list[Result]:
    """Probe the gaps (all, or ``names``) on this machine's TPU: the real one, the real wheel on XLA:CPU, or the
    emulator."""
    from hf_tpu.plumbing.backend import needs_emulator

    emulated = needs_emulator()
    names = names or [gap.name for gap in GAPS]
    for name in names:
        get(name)
    # On a chip, probes must not run side by side: each holds the chips it opens. XLA:CPU holds nothing.
    from hf_tpu import xla_cpu

    side_by_side = emulated or xla_cpu.requested()
    workers = 1 if not side_by_side else max(1, jobs or (os.cpu_count() or 1))

    def probe(name: str) -> Result:
        off_env, on_env = _environments(name, emulated)
        off, detail = _run_probe(name, off_env, timeout)
        outcome = _outcome(off, get(name).intermittent)
        on = _outcome(_run_probe(name, on_env, timeout)[0]) if outcome in ("present", "not seen") else outcome
        return Result(name, outcome, on, get(name).workaround, detail)

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(probe, names))


def _backend_label() -> str:
    import torch

    from hf_tpu import emulator
    from hf_tpu.gaps import status

    host = emulator.host()
    if host is None:
        from hf_tpu import xla_cpu

        where = " on XLA:CPU (the real wheel, HF_TPU_XLA_CPU=1)" if xla_cpu.active() else ""
        return f"TorchTPU{where}, torch-tpu {status._version('torch-tpu')}, torch {torch.__version__}"
    return f"the emulated TPU (profile {host.profile}, {host.usable} chip(s)), torch {torch.__version__}"


def format_table(results: list[Result]) -> str:
    rows = [("gap", "without workarounds", "hf-tpu")]
    for r in results:
        gap = get(r.name)
        if r.without_workarounds not in ("present", "not seen"):
            fix = "-" if r.without_workarounds != "n/a" else f"(needs {gap.needs_chips} chips)"
        elif r.workaround is None:
            fix = f"no workaround: {gap.advice}"
        elif r.with_workarounds == "fixed":
            fix = f"worked around ({r.workaround})"
        else:
            fix = f"{r.workaround} did not close it ({r.with_workarounds})"
        rows.append((r.name, r.without_workarounds, fix))
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"  {a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows]
    present = [r for r in results if r.without_workarounds == "present"]
    closed = [r for r in present if r.with_workarounds == "fixed"]
    still = [r.name for r in present if r.with_workarounds != "fixed"]
    summary = f"{len(present)} of {len(results)} gaps present; hf-tpu works around {len(closed)}"
    summary += f"; still open: {', '.join(still)}" if still else ""
    unseen = [r.name for r in results if r.without_workarounds == "not seen"]
    summary += f"; intermittent, not seen this time (workaround kept): {', '.join(unseen)}" if unseen else ""
    return "\n".join([*lines, summary])


def format_fixes() -> str:
    """The registry of hf-tpu's fixes in this process: upstream patches and backend workarounds."""
    from hf_tpu import fixes

    rows = fixes.registered()
    count = {kind: sum(r.kind == kind for r in rows) for kind in ("workaround", "patch", "default", "xla_cpu_limit")}
    lines = [
        f"hf-tpu fixes: {count['workaround']} workarounds, {count['patch']} patches, {count['default']} TPU defaults"
        + (f", {count['xla_cpu_limit']} for XLA:CPU's limits" if count["xla_cpu_limit"] else "")
    ]
    for kind in ("workaround", "patch", "default", "xla_cpu_limit"):
        for fix in (r for r in rows if r.kind == kind):
            lines.append(f"  {fix.name:<40} {kind:<13} {fix.gap:<30} {fix.state}")
            lines.append(f"  {'':<40} {fix.why}")
            if fix.off:
                lines.append(f"  {'':<40} off: {fix.off}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    from hf_tpu.gaps import BY_NAME

    gaps = sub.add_parser("gaps", help="probe the TPU backend's known gaps (each in its own process)")
    gaps.add_argument("--show", choices=sorted(BY_NAME), help="print a gap's standalone probe and exit")
    gaps.add_argument("--only", nargs="+", choices=sorted(BY_NAME), metavar="GAP", help="probe just these gaps")
    gaps.add_argument("--chips", type=int, help="emulated TPU: chips on the emulated host (multi-chip gaps need 2+)")
    gaps.add_argument("--jobs", type=int, help="emulated TPU: probes run side by side (default: CPU count)")
    gaps.add_argument("--timeout", type=float, default=600, help="seconds per probe (default 600)")
    gaps.add_argument("--json", action="store_true", help="print the results as JSON")
    gaps.add_argument("--no-save", action="store_true", help="do not record the measurement for this machine")
    gaps.add_argument("--fixes", action="store_true", help="list hf-tpu's patches and workarounds, and their state")
    gaps.set_defaults(command_function=command, usage_error=gaps.error)


def command(args: argparse.Namespace) -> int:
    """``hf-tpu gaps``: probe, show a probe, or list the fixes."""
    if args.chips is not None and args.chips < 1:
        args.usage_error(f"--chips must be at least 1, got {args.chips}")
    from hf_tpu import emulator
    from hf_tpu.gaps import status
    from hf_tpu.plumbing.backend import needs_emulator

    if args.show:
        sys.stdout.write(script(args.show))
        return 0
    if args.fixes:
        if needs_emulator():
            emulator.enable(quiet=True)
        else:
            import torch  # noqa: F401  (a real TPU, or the real wheel on XLA:CPU, sets itself and the fixes up)
        sys.stdout.write(format_fixes() + "\n")
        return 0
    if args.chips:
        os.environ["HF_TPU_EMULATOR_CHIPS"] = str(args.chips)
    if needs_emulator():
        emulator.enable(quiet=True)  # to name the backend; it opens no chip
    else:
        import torch  # noqa: F401  (the real TPU, or the real wheel on XLA:CPU, is set up by the autoload)
    results = run(args.only or None, jobs=args.jobs, timeout=args.timeout)
    if not args.no_save:
        measured = {r.name: r.without_workarounds for r in results if r.without_workarounds in ("present", "fixed")}
        path = status.save_measurement({**(status.load_measurement() or {}).get("gaps", {}), **measured})
    if args.json:
        sys.stdout.write(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    else:
        sys.stdout.write(f"hf-tpu gaps: {len(results)} probes on {_backend_label()}, each in its own process\n")
        sys.stdout.write(format_table(results) + "\n")
        if not args.no_save:
            sys.stdout.write(f"measurement saved to {path}: workarounds follow it from now on\n")
    return 0 if all(r.without_workarounds != "present" for r in results) else 1
