"""Results in the ecosystem's formats: per-model ``--make-reports`` directories and ``model_results.json``.

Per test, the outcome comes from the JSON log each test process writes as it goes (it survives an
abort); the report directories are transformers' own files, merged over the processes of a model's
files, with a FAILED line added for each test a process died in. ``model_results.json`` follows the
schema of transformers' ``utils/tpu_ci/make_model_results.py`` (what the CI dashboard reads).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from .runner import file_dir, read_log

REPORT_FILES = (
    "durations",
    "errors",
    "failures_long",
    "failures_short",
    "failures_line",
    "passes",
    "stats",
    "summary_short",
    "warnings",
)
TEST_CATEGORIES = ("PyTorch", "Tokenizers", "Pipelines", "Trainer", "ONNX", "Auto", "Quantization", "Unclassified")
CATEGORY_RULES = (
    ("tests/quantization", "Quantization"),
    ("test_modeling", "PyTorch"),
    ("test_models_", "PyTorch"),  # diffusers' model tests
    ("test_tokenization", "Tokenizers"),
    ("test_pipelines", "Pipelines"),
    ("test_trainer", "Trainer"),
    ("onnx", "ONNX"),
    ("auto", "Auto"),
)
MACHINE_KEYS = {"single-gpu": "single", "multi-gpu": "multi"}
STATS_RE = re.compile(r"(\d+) (failed|passed|skipped|errors?|xfailed|xpassed|warnings?|deselected)")
TIME_RE = re.compile(r" in ([\d.]+)s")
FAILING = ("failed", "error")


def outcomes(out: Path, side: str, records: list[dict]) -> dict[str, dict]:
    """``{nodeid: entry}`` for one side: the last phase that decided each test, aborts included."""
    result: dict[str, dict] = {}
    for record in records:
        if record["side"] != side:
            continue
        for entry in read_log(file_dir(out, side, record["path"]) / "log.jsonl"):
            entry = dict(entry, family=record["family"], suite=record["suite"])
            previous = result.get(entry["nodeid"])
            # a failing teardown after a passed call still fails the test; never let a later pass hide a failure
            if previous is None or previous["outcome"] not in FAILING:
                result[entry["nodeid"]] = entry
        for death in record["deaths"]:
            result[death["nodeid"]] = {
                "nodeid": death["nodeid"],
                "when": "call",
                "outcome": "failed",
                "duration": 0.0,
                "message": death["reason"],
                "test": death["nodeid"],
                "trace": death["reason"],
                "line": None,
                "death": True,
                "family": record["family"],
                "suite": record["suite"],
            }
    return result


def report_dir_name(machine: str, suite: str, family: str) -> str:
    """``<machine>_<suite>_<matrix>_test_reports``, the matrix being ``models_<family>`` as upstream's."""
    return f"{machine}_{'models' if suite == 'transformers' else suite}_models_{family}_test_reports"


def count(entries: list[dict]) -> Counter:
    counts: Counter = Counter()
    for entry in entries:
        counts[entry["outcome"]] += 1
    return counts


def stats_line(counts: Counter, seconds: float) -> str:
    order = (
        ("failed", "failed"),
        ("passed", "passed"),
        ("skipped", "skipped"),
        ("xfailed", "xfailed"),
        ("xpassed", "xpassed"),
        ("error", "errors"),
    )
    parts = [f"{counts[key]} {word}" for key, word in order if counts[key]]
    return f"==== {', '.join(parts) or 'no tests ran'} in {seconds:.2f}s ===="


def parse_stats(text: str) -> tuple[Counter, float]:
    """Counts and seconds from a pytest stats line (``stats.txt``), as the dashboard reads it."""
    counts: Counter = Counter()
    for number, word in STATS_RE.findall(text):
        counts[{"errors": "error", "warning": "warnings"}.get(word, word)] += int(number)
    match = TIME_RE.search(text)
    return counts, float(match.group(1)) if match else 0.0


def write_report_dirs(out: Path, side: str, machine: str, records: list[dict], tests: dict[str, dict]) -> list[Path]:
    """Merge each model's per-process report files into one ``--make-reports`` directory."""
    by_model: dict[tuple[str, str], list[dict]] = {}
    for record in records:
        if record["side"] == side:
            by_model.setdefault((record["suite"], record["family"]), []).append(record)
    written = []
    for (suite, family), model_records in sorted(by_model.items()):
        target = out / side / "reports" / report_dir_name(machine, suite, family)
        target.mkdir(parents=True, exist_ok=True)
        texts = {name: [] for name in REPORT_FILES}
        for record in model_records:
            for part in sorted((file_dir(out, side, record["path"]) / "reports").glob("part*")):
                for name in REPORT_FILES:
                    path = part / f"{name}.txt"
                    if path.is_file() and name != "stats":
                        texts[name].append(path.read_text(encoding="utf-8", errors="replace"))
        entries = [e for e in tests.values() if e["suite"] == suite and e["family"] == family]
        # a process that died wrote no summary: list its failures (and the test it died in) as pytest would
        listed = {
            line.split()[1]
            for chunk in texts["summary_short"]
            for line in chunk.splitlines()
            if line.startswith(("FAILED ", "ERROR "))
        }
        for entry in sorted(entries, key=lambda e: e["nodeid"]):
            if entry["outcome"] in FAILING and entry["nodeid"] not in listed:
                word = "FAILED" if entry["outcome"] == "failed" else "ERROR"
                texts["summary_short"].append(f"{word} {entry['nodeid']} - {entry['message']}\n")
                texts["failures_line"].append(
                    f"{entry['nodeid'].split('::')[0]}:{entry.get('line') or 0}: {entry['message']}\n"
                )
        seconds = sum(e["duration"] for e in entries)
        texts["stats"] = [stats_line(count(entries), seconds) + "\n"]
        for name, chunks in texts.items():
            (target / f"{name}.txt").write_text("".join(chunks), encoding="utf-8")
        written.append(target)
    return written


SUBFAILED_RE = re.compile(r"^SUBFAILED(\[.*?\])?(\(.*?\))? (\S+)")


def listed_keys(summary_short: str) -> set[str]:
    """The tests a ``summary_short.txt`` lists as failed or errored (subtests under their own key)."""
    keys = set()
    for line in summary_short.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            keys.add(line.split()[1])
        elif match := SUBFAILED_RE.match(line):
            description = " ".join(p for p in (match.group(1), match.group(2)) if p)
            keys.add(f"{match.group(3)}[subtest:{description.replace(' ', '')}]")
    return keys


def category(nodeid: str) -> str:
    for pattern, name in CATEGORY_RULES:
        if pattern in nodeid:
            return name
    return "Unclassified"


def model_results(tests: dict[str, dict], records: list[dict], side: str, machine: str) -> dict[str, dict]:
    """The dashboard's ``model_results.json`` for one side, keyed ``models_<family>``."""
    gpu = MACHINE_KEYS.get(machine, "multi")
    results: dict[str, dict] = {}
    for record in records:
        if record["side"] != side:
            continue
        entry = results.setdefault(
            f"models_{record['family']}",
            {
                "failed": {c: {"unclassified": 0, "single": 0, "multi": 0} for c in TEST_CATEGORIES},
                "errors": 0,
                "success": 0,
                "skipped": 0,
                "time_spent": [],
                "error": False,
                "failures": {},
                "job_link": {},
                "captured_info": {},
            },
        )
        entry["time_spent"].append(round(record["wall_s"], 2))
        entry["error"] = entry["error"] or bool(record["deaths"])
    for test in sorted(tests.values(), key=lambda t: t["nodeid"]):
        entry = results[f"models_{test['family']}"]
        outcome = test["outcome"]
        if outcome in ("passed", "xpassed"):
            entry["success"] += 1
        elif outcome in ("skipped", "xfailed"):
            entry["skipped"] += 1
        elif outcome == "error":
            entry["errors"] += 1
        elif outcome == "failed":
            entry["failed"][category(test["nodeid"])][gpu] += 1
            line = test.get("line")
            trace = f"(line {line + 1 if isinstance(line, int) else '?'})  {test['message']}"
            entry["failures"].setdefault(gpu, []).append({"line": test["nodeid"], "trace": trace})
    return results


def failed_total(entry: dict) -> int:
    return sum(n for per_machine in entry["failed"].values() for n in per_machine.values())


def check_reports_parse_back(out: Path, side: str, results: dict[str, dict]) -> list[str]:
    """Read each report directory back as the dashboard would; return the mismatches (none: good)."""
    problems = []
    for directory in sorted((out / side / "reports").glob("*_test_reports")):
        matrix = "_".join(directory.name.removesuffix("_test_reports").split("_")[2:])
        entry = results.get(matrix)
        if entry is None:
            problems.append(f"{directory.name}: no entry {matrix!r} in model_results.json")
            continue
        counts, _ = parse_stats((directory / "stats.txt").read_text())
        expected = {
            "passed": entry["success"],
            "skipped": entry["skipped"],
            "error": entry["errors"],
            "failed": failed_total(entry),
        }
        got = {
            "passed": counts["passed"] + counts["xpassed"],
            "skipped": counts["skipped"] + counts["xfailed"],
            "error": counts["error"],
            "failed": counts["failed"],
        }
        if got != expected:
            problems.append(f"{directory.name}: stats.txt says {got}, model_results.json {expected}")
        listed = listed_keys((directory / "summary_short.txt").read_text())
        missing = {f["line"] for f in entry["failures"].get("multi", []) + entry["failures"].get("single", [])} - listed
        if missing:
            problems.append(f"{directory.name}: summary_short.txt lacks FAILED lines for {sorted(missing)[:3]}")
    return problems


def write_model_results(path: Path, results: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=4, ensure_ascii=False), encoding="utf-8")
