"""``python -m ci``: run Hugging Face test suites on a TPU (real or emulated) beside a CPU baseline.

python -m ci run --suite transformers --models qwen3,llama --out ci-out
python -m ci run --suite diffusers --models sd3,flux --out ci-out
python -m ci report ci-out --previous yesterday/      # rebuild the summary, with the delta
python -m ci show ci-out 1                            # print repro script 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from . import repro, results, suites, summary, triage
from .devices import Side, tpu_side, versions
from .runner import FileJob, run_all


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _positive(kind: type, name: str):  # noqa: ANN202
    def parse(text: str):  # noqa: ANN202
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} {text!r}: expected a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} {text!r}: must be > 0")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ci", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run test files on tpu and CPU, write reports, triage and repros")
    run.add_argument(
        "--suite", action="append", choices=suites.SUITES, help="transformers (default) and/or diffusers; repeatable"
    )
    run.add_argument(
        "--suite-dir",
        action="append",
        default=[],
        metavar="[SUITE=]PATH",
        help="a checkout to take the tests from (default: fetched for the installed version)",
    )
    run.add_argument(
        "--models", default=None, help="comma-separated families (qwen3,llama), or IMPORTANT_MODELS (the default)"
    )
    run.add_argument("--files", default="test_*.py", help="file pattern inside each family (default test_*.py)")
    run.add_argument("-k", dest="keyword", default=None, help="pytest -k expression")
    run.add_argument("--out", type=Path, default=Path("ci-out"), help="output directory (a rerun resumes it)")
    run.add_argument("--devices", default="tpu,cpu", help="tpu,cpu (default) or one of them")
    run.add_argument(
        "--jobs",
        type=_positive(int, "--jobs"),
        default=None,
        help="test processes at a time (default: CPU count; a real TPU's run one at a time)",
    )
    run.add_argument(
        "--timeout",
        type=_positive(float, "--timeout"),
        default=600.0,
        help="seconds per test (pytest-timeout; default 600)",
    )
    run.add_argument(
        "--file-timeout",
        type=_positive(float, "--file-timeout"),
        default=3600.0,
        help="seconds per test file (default 3600)",
    )
    run.add_argument(
        "--workarounds",
        choices=("on", "off"),
        default="on",
        help="hf-tpu's workarounds on tpu: on (what users get) or off (TorchTPU alone)",
    )
    run.add_argument(
        "--machine-type",
        choices=tuple(results.MACHINE_KEYS),
        default="multi-gpu",
        help="key in report names and model_results.json (upstream's spelling)",
    )
    run.add_argument(
        "--run-slow",
        action="store_true",
        default=os.environ.get("RUN_SLOW", "").lower() in ("1", "yes", "true"),
        help="also run @slow tests (or RUN_SLOW=1)",
    )
    run.add_argument("--no-triage", action="store_true", help="skip the triage reruns and repros")
    run.add_argument("--no-verify", action="store_true", help="write repros without running them to check")
    run.add_argument("--previous", type=Path, default=None, help="a previous run's output: new failures, fixed, flaky")
    run.add_argument("--fresh", action="store_true", help="forget finished files in --out and run everything again")

    report = commands.add_parser("report", help="rebuild summary.md from a run's results.json")
    report.add_argument("out", type=Path)
    report.add_argument("--previous", type=Path, default=None)

    show = commands.add_parser("show", help="print a repro script (list them without N)")
    show.add_argument("out", type=Path)
    show.add_argument("which", nargs="?", default=None, help="the repro's number or a word of its name")
    return parser


def _suites(args: argparse.Namespace) -> list[suites.Suite]:
    dirs: dict[str, str] = {}
    for item in args.suite_dir:
        name, _, path = item.rpartition("=")
        dirs[name or (args.suite or ["transformers"])[0]] = path
    names = args.suite or sorted(dirs) or ["transformers"]
    return [suites.from_checkout(n, dirs[n]) if n in dirs else suites.fetch(n, log=_say) for n in names]


def _jobs(args: argparse.Namespace, suite_list: list[suites.Suite], sides: list[Side]) -> list[tuple[Path, FileJob]]:
    """Every (suite, family, file) on every side. A named family runs in each suite that has it."""
    named = (
        None if args.models in (None, "IMPORTANT_MODELS") else [m.strip() for m in args.models.split(",") if m.strip()]
    )
    selected: list[tuple[suites.Suite, str, str]] = []
    for family in named or []:
        errors, found = [], []
        for suite in suite_list:
            try:
                found += [(suite, family, path) for path in suite.files(family, args.files)]
            except suites.SuiteError as error:
                errors.append(str(error))
        if not found:
            raise suites.SuiteError(errors[0])
        selected += found
    if named is None:
        selected = [(s, f, p) for s in suite_list for f in s.important_models() for p in s.files(f, args.files)]
    return [(suite.root, FileJob(suite.name, family, path, side)) for side in sides for suite, family, path in selected]


def run(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    if args.fresh and out.exists():
        import shutil

        shutil.rmtree(out)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    bad = [d for d in devices if d not in ("tpu", "cpu")]
    if bad or not devices:
        raise SystemExit(f"--devices {args.devices!r}: use tpu, cpu or tpu,cpu")
    tpu = tpu_side(workarounds=args.workarounds == "on")
    sides = [tpu if d == "tpu" else Side("cpu", emulated=False) for d in devices]
    try:
        suite_list = _suites(args)
        jobs = _jobs(args, suite_list, sides)
    except suites.SuiteError as error:
        raise SystemExit(f"python -m ci: {error}") from None
    workers = args.jobs or os.cpu_count() or 1
    _say(
        f"python -m ci: {len(jobs)} test file runs on {', '.join(s.label() for s in sides)}, {workers} at a time -> {out}"
    )
    extra = ["-k", args.keyword] if args.keyword else []
    records = run_all(
        jobs,
        out,
        workers=workers,
        serial_tpu=not tpu.emulated,
        progress=_say,
        timeout=args.timeout,
        file_timeout=args.file_timeout,
        run_slow=args.run_slow,
        extra=extra,
    )
    document = collect(out, records, sides, suite_list, args.machine_type)
    if not args.no_triage and "tpu" in devices and "cpu" in devices:
        _triage(document, out, suite_list, tpu, args)
    finish(document, out, args.previous)
    return 0


def collect(out: Path, records: list[dict], sides: list[Side], suite_list: list[suites.Suite], machine: str) -> dict:
    """Per-test outcomes of both sides, the report directories and ``model_results.json``."""
    tests: dict[str, dict] = {}
    model_results: dict[str, dict] = {}
    problems: list[str] = []
    for side in sides:
        entries = results.outcomes(out, side.device, records)
        results.write_report_dirs(out, side.device, machine, records, entries)
        model_results[side.device] = results.model_results(entries, records, side.device, machine)
        results.write_model_results(out / side.device / "model_results.json", model_results[side.device])
        problems += results.check_reports_parse_back(out, side.device, model_results[side.device])
        for nodeid, entry in entries.items():
            test = tests.setdefault(
                nodeid, {"suite": entry["suite"], "family": entry["family"], "test": entry.get("test", nodeid)}
            )
            test[side.device] = entry["outcome"]
            test[f"{side.device}_message"] = entry["message"]
            test[f"{side.device}_trace"] = entry.get("trace", "")[-1500:]
    return {
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "out": str(out),
        "suites": [
            {"name": s.name, "version": s.version, "source": s.source, "root": str(s.root), "overlaid": s.overlaid}
            for s in suite_list
        ],
        "sides": {s.device: s.label() for s in sides},
        "machine": machine,
        "versions": versions(),
        "tests": tests,
        "groups": summary.compare(tests),
        "model_results": model_results,
        "report_problems": problems,
        "deaths": [dict(d, side=r["side"], path=r["path"]) for r in records for d in r["deaths"]],
    }


def _triage(document: dict, out: Path, suite_list: list[suites.Suite], tpu: Side, args: argparse.Namespace) -> None:
    groups = document["groups"]
    failing = groups["tpu_only"] + groups["no_baseline"]
    document["triage"], document["repros"] = {}, []
    for suite in suite_list:
        failures = [
            {
                "nodeid": n,
                "test": document["tests"][n]["test"],
                "message": document["tests"][n]["tpu_message"],
                "trace": document["tests"][n]["tpu_trace"],
            }
            for n in failing
            if document["tests"][n]["suite"] == suite.name
        ]
        if not failures:
            continue
        _say(f"triage: {len(failures)} {suite.name} failure(s) on tpu, rerun under other conditions")
        verdicts = triage.triage(
            suite.root,
            out,
            failures,
            tpu,
            timeout=args.timeout,
            limit=args.file_timeout,
            run_slow=args.run_slow,
            extra=[],
            workers=args.jobs or os.cpu_count() or 1,
        )
        document["triage"].update(verdicts)
        document["repros"] += repro.write(out, suite.root, failures, verdicts, tpu, check=not args.no_verify)


def finish(document: dict, out: Path, previous: Path | None) -> None:
    old = None
    if previous is not None:
        path = previous / "results.json" if previous.is_dir() else previous
        if not path.is_file():
            raise SystemExit(f"--previous {previous}: no results.json there")
        old = json.loads(path.read_text())
        document["previous"] = str(previous)
    document["delta"] = summary.delta(document, old)
    (out / "results.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    text = summary.render(document)
    (out / "summary.md").write_text(text, encoding="utf-8")
    groups = document["groups"]
    _say(
        f"python -m ci: {len(document['tests'])} tests; TPU-only failures {len(groups['tpu_only'])}, shared with CPU "
        f"{len(groups['shared'])}, no CPU baseline {len(groups['no_baseline'])}; {len(document['deaths'])} process death(s) "
        f"contained; {len(document.get('repros', []))} repro(s)"
    )
    for problem in document["report_problems"]:
        _say(f"report check: {problem}")
    _say(f"summary: {out / 'summary.md'}; dashboard: {out}/<side>/model_results.json; reports: {out}/<side>/reports/")


def report(args: argparse.Namespace) -> int:
    path = args.out / "results.json"
    if not path.is_file():
        raise SystemExit(
            f"python -m ci report {args.out}: no results.json there (run `python -m ci run --out {args.out}` first)"
        )
    finish(json.loads(path.read_text()), args.out.resolve(), args.previous)
    return 0


def show(args: argparse.Namespace) -> int:
    path = args.out / "results.json"
    if not path.is_file():
        raise SystemExit(f"python -m ci show {args.out}: no results.json there")
    made = json.loads(path.read_text()).get("repros", [])
    if args.which is None:
        for index, item in enumerate(made, start=1):
            state = {True: "reproduces", False: "does not reproduce", None: "not checked"}[item["reproduces"]]
            _say(
                f"{index:2d}  {item['script']}  [{item['kind']}, {len(item['tests'])} test(s), {state}]  {item['key']}"
            )
        if not made:
            _say("no repros: no TPU-only failures were triaged in this run")
        return 0
    chosen = [m for i, m in enumerate(made, start=1) if args.which == str(i) or args.which in m["script"]]
    if not chosen:
        raise SystemExit(f"python -m ci show: no repro {args.which!r}; `python -m ci show {args.out}` lists them")
    sys.stdout.write((args.out / chosen[0]["script"]).read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"run": run, "report": report, "show": show}[args.command](args)
