"""The markdown summary of a run, rebuilt from ``results.json`` every time (never appended to)."""

from __future__ import annotations

from collections import Counter

from .results import failed_total

FAILING = ("failed", "error")


def outcome(tests: dict[str, dict], nodeid: str, side: str) -> str | None:
    """A test's outcome on one side. Subtests are logged only when they fail or skip, so a subtest
    missing from a side whose test ran there passed."""
    test = tests[nodeid]
    found = test.get(side)
    if found is None and test.get("test", nodeid) != nodeid:
        if tests.get(test["test"], {}).get(side) in ("passed", "failed"):
            return "passed"
    return found


def compare(tests: dict[str, dict]) -> dict[str, list[str]]:
    """Split tpu's failures: TPU-only (CPU passed), shared with CPU, and without a CPU baseline."""
    groups: dict[str, list[str]] = {"tpu_only": [], "shared": [], "no_baseline": [], "cpu_only": []}
    for nodeid in sorted(tests):
        tpu, cpu = outcome(tests, nodeid, "tpu"), outcome(tests, nodeid, "cpu")
        if tpu in FAILING:
            if cpu in ("passed", "xpassed"):
                groups["tpu_only"].append(nodeid)
            elif cpu in FAILING:
                groups["shared"].append(nodeid)
            else:  # skipped on CPU (an accelerator-only test) or not run there
                groups["no_baseline"].append(nodeid)
        elif cpu in FAILING and tpu in ("passed", "xpassed"):
            groups["cpu_only"].append(nodeid)
    return groups


def delta(current: dict, previous: dict | None) -> dict[str, list[str]] | None:
    """New failures, fixed tests and flaky ones against a previous run's ``results.json``."""
    if previous is None:
        return None
    before, now = previous["tests"], current["tests"]
    failing_now = {n for n, t in now.items() if t.get("tpu") in FAILING}
    failing_before = {n for n, t in before.items() if t.get("tpu") in FAILING}
    flaky = sorted(n for n, v in current.get("triage", {}).items() if v["bucket"] == "flaky")
    return {
        "new_failures": sorted(n for n in failing_now - failing_before if n not in flaky),
        "fixed": sorted(n for n in failing_before - failing_now if now.get(n, {}).get("tpu") in ("passed", "xpassed")),
        "still_failing": sorted(failing_now & failing_before),
        "flaky": flaky,
    }


def _rate(passed: int, failed: int) -> str:
    attempted = passed + failed
    return f"{100 * passed / attempted:.1f}%" if attempted else "n/a"


def render(results: dict) -> str:
    sides = results["sides"]
    lines = [f"# hf-tpu ci: {results['created']}", ""]
    for suite in results["suites"]:
        lines.append(
            f"- {suite['name']} {suite['version']}: {suite['source']}"
            + (f"; hf-tpu testers: {len(suite['overlaid'])} files" if suite["overlaid"] else "")
        )
    lines.append(f"- tpu: {sides.get('tpu', 'not run')}; baseline: {sides.get('cpu', 'not run')}")
    lines.append("- versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()))
    lines += [
        "",
        "| Model | tpu passed | failed | skipped | errors | time (s) | CPU passed | failed | skipped | errors | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter = Counter()
    for model in sorted(set(results["model_results"].get("tpu", {})) | set(results["model_results"].get("cpu", {}))):
        row = [model + (" ⚠️ incomplete" if results["model_results"].get("tpu", {}).get(model, {}).get("error") else "")]
        for side in ("tpu", "cpu"):
            entry = results["model_results"].get(side, {}).get(model)
            if entry is None:
                row += ["-"] * 5
                continue
            failed = failed_total(entry)
            row += [
                str(entry["success"]),
                str(failed),
                str(entry["skipped"]),
                str(entry["errors"]),
                f"{sum(entry['time_spent']):.0f}",
            ]
            totals[f"{side}_passed"] += entry["success"]
            totals[f"{side}_failed"] += failed + entry["errors"]
            totals[f"{side}_skipped"] += entry["skipped"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for side in ("tpu", "cpu"):
        if side in results["model_results"]:
            lines.append(
                f"Pass rate over attempted tests on {side}: {_rate(totals[side + '_passed'], totals[side + '_failed'])} "
                f"({totals[side + '_passed']} of {totals[side + '_passed'] + totals[side + '_failed']}; "
                f"{totals[side + '_skipped']} skipped, not counted)."
            )
    groups = results["groups"]
    triage = results.get("triage", {})
    repros = {test: repro for repro in results.get("repros", []) for test in repro["tests"]}
    lines += ["", f"## TPU-only failures: {len(groups['tpu_only'])} (pass on CPU, fail on tpu)", ""]
    if groups["tpu_only"] or groups["no_baseline"]:
        buckets = Counter(
            triage.get(n, {}).get("bucket", "not triaged") for n in groups["tpu_only"] + groups["no_baseline"]
        )
        lines += ["| Bucket | Tests |", "|---|---|"] + [f"| {b} | {c} |" for b, c in buckets.most_common()] + [""]
    for title, key in (("", "tpu_only"), ("### Failing on tpu, skipped on CPU (no baseline)", "no_baseline")):
        if title and groups[key]:
            lines += ["", title, ""]
        for nodeid in groups[key]:
            verdict = triage.get(nodeid)
            message = results["tests"][nodeid].get("tpu_message", "")[:160]
            if verdict is None:
                lines.append(f"- `{nodeid}` — not triaged — {message}")
                continue
            repro = repros.get(nodeid)
            where = (
                f"; repro `{repro['script']}` ({'reproduces' if repro['reproduces'] else 'does not reproduce: ' + repro['detail'] if repro['reproduces'] is False else 'not checked'})"
                if repro
                else ""
            )
            lines.append(
                f"- `{nodeid}` — **{verdict['bucket']}**{' (gap ' + verdict['gap'] + ')' if verdict['gap'] else ''} — {'; '.join(verdict['evidence'][2:]) or message}{where}"
            )
    lines += ["", f"## Failures CPU shares: {len(groups['shared'])} (not TPU problems)", ""]
    lines += [f"- `{n}` — {results['tests'][n].get('tpu_message', '')[:160]}" for n in groups["shared"]]
    if groups["cpu_only"]:
        lines += ["", f"## Failing on CPU only: {len(groups['cpu_only'])}", ""] + [
            f"- `{n}`" for n in groups["cpu_only"]
        ]
    if results.get("deaths"):
        lines += [
            "",
            f"## Processes that died: {len(results['deaths'])} (each cost its test, the rest of the file ran)",
            "",
        ]
        lines += [f"- {d['side']}: `{d['nodeid']}` — {d['reason']}" for d in results["deaths"]]
    change = results.get("delta")
    if change is not None:
        lines += ["", f"## Against the previous run ({results.get('previous', '')})", ""]
        for key, title in (
            ("new_failures", "New failures"),
            ("fixed", "Fixed"),
            ("flaky", "Flaky (passed when rerun)"),
            ("still_failing", "Still failing"),
        ):
            lines.append(
                f"- {title}: {len(change[key])}"
                + "".join(f"\n  - `{n}`" for n in change[key][:50] if key != "still_failing")
            )
    lines += [
        "",
        "Repros: `python -m ci show " + results["out"] + " N` prints script N; each runs alone (`python <script>`).",
    ]
    return "\n".join(lines) + "\n"
