"""Triage by evidence: each TPU-only failure is rerun under conditions that tell its causes apart.

1. What the failure itself shows: the process died (abort, or the emulator's "TorchTPU aborts the
   process here"), the test ran past its timeout, the chip was held by another process, an op is not
   implemented, the compiler failed. A known gap's own error names it (``hf-tpu gaps``).
2. Rerun on the same side, recording the aten op that raised: passes now → ``flaky``.
3. Rerun with float32 matmuls at precision "highest": passes → ``float32 precision``.
4. Emulated TPU only: rerun on the emulator's ``ideal`` profile (CPU numerics, no gaps): passes →
   ``TorchTPU gap``.
5. Anything else: ``needs triage``, with the evidence gathered.

Reruns are batched: one process per test file and condition, the failing nodes only.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from .devices import Side
from .runner import read_log, run_targets

RULES = (
    ("timeout", r"^timeout:|Failed: Timeout"),
    ("process abort", r"^process abort:|TorchTPU aborts the process here"),
    ("device held by another process", r"runtime cannot open|held by (another )?process"),
    ("op not implemented", r"is not implemented for|NotImplementedError"),
    ("compiler", r"InductorError|BackendCompilerFailed|torch\._dynamo\.exc\.|CompilationError"),
)
PRECISION = "float32 precision"
GAP = "TorchTPU gap"
FLAKY = "flaky"
UNTRIAGED = "needs triage"
KNOWN_GAP_RE = re.compile(r"known gap '([a-z_]+)'")


def rule_bucket(text: str) -> str | None:
    for bucket, pattern in RULES:
        if re.search(pattern, text, re.MULTILINE):
            return bucket
    return None


def gap_named(text: str) -> str | None:
    """The ``hf-tpu gaps`` entry a failure's error points at, if any."""
    from hf_tpu.gaps import GAPS

    match = KNOWN_GAP_RE.search(text)
    if match:
        return match.group(1)
    for gap in GAPS:
        if gap.signature and re.search(gap.signature, text):
            return gap.name
    return None


def _rerun(
    root: Path,
    directory: Path,
    failures: list[dict],
    side: Side,
    env_extra: dict[str, str],
    workers: int = 1,
    **kwargs: object,
) -> dict[str, dict]:
    """Rerun failing nodes, one process per file, ``workers`` at a time; ``{nodeid: entry}`` (a death counts as failed)."""
    by_file: dict[str, list[str]] = {}
    for failure in failures:
        nodes = by_file.setdefault(failure["nodeid"].split("::")[0], [])
        if failure["test"] not in nodes:
            nodes.append(failure["test"])
    if side.device == "tpu" and not side.emulated:
        workers = 1  # one process owns a real TPU's chips
    threads = max(1, (os.cpu_count() or 1) // workers)

    def one(item: tuple[int, list[str]]) -> tuple[Path, list[dict]]:
        target = directory / f"{item[0]:03d}"
        _, deaths, _ = run_targets(
            root, target, item[1], side, env_extra=env_extra, reports=False, threads=threads, **kwargs
        )
        return target, deaths

    results: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(one, enumerate(nodes for _, nodes in sorted(by_file.items()))))
    for target, deaths in done:
        for entry in read_log(target / "log.jsonl"):
            if entry["nodeid"] not in results or entry["outcome"] in ("failed", "error"):
                results[entry["nodeid"]] = entry
        for death in deaths:
            results[death["nodeid"]] = {"nodeid": death["nodeid"], "outcome": "failed", "message": death["reason"]}
    return results


def _passed(results: dict[str, dict], failure: dict) -> bool:
    """Passed on a rerun: its entry passed, or (a subtest, logged only when it fails) its test passed."""
    entry = results.get(failure["nodeid"])
    if entry is not None:
        return entry["outcome"] == "passed"
    return failure["nodeid"] != failure["test"] and results.get(failure["test"], {}).get("outcome") == "passed"


def triage(root: Path, out: Path, failures: list[dict], side: Side, **kwargs: object) -> dict[str, dict]:
    """``{nodeid: {"bucket", "gap", "evidence", "op"}}`` for the TPU-only failures of one suite."""
    directory = out / "triage" / root.name
    verdicts: dict[str, dict] = {}
    for failure in failures:
        text = f"{failure['message']}\n{failure.get('trace', '')}"
        bucket = rule_bucket(text)
        evidence = [f"tpu: {failure['message'][:300]}", "cpu: passed"]
        verdicts[failure["nodeid"]] = {"bucket": bucket, "gap": gap_named(text), "evidence": evidence, "op": None}

    rerunnable = [f for f in failures if verdicts[f["nodeid"]]["bucket"] != "timeout"]
    ops_dir = directory / "ops"
    again = _rerun(root, directory / "again", rerunnable, side, {"HF_TPU_CI_RECORD_OPS": str(ops_dir)}, **kwargs)
    undecided = []
    for failure in rerunnable:
        verdict = verdicts[failure["nodeid"]]
        record = ops_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", failure["test"])[-200:] + ".json")
        if record.is_file():
            op = json.loads(record.read_text())
            # the op's error must be the failure's, not one the test caught on purpose
            if op["error"].split(":", 1)[-1].strip()[:80] in f"{failure['message']}\n{failure.get('trace', '')}":
                verdict["op"] = op
                verdict["evidence"].append(f"raised by {op['op']}")
        if _passed(again, failure):
            verdict["bucket"] = FLAKY
            verdict["evidence"].append("tpu rerun: passed (flaky)")
        elif verdict["bucket"] is None:
            verdict["evidence"].append("tpu rerun: failed again")
            undecided.append(failure)

    if undecided:
        highest = _rerun(root, directory / "highest", undecided, replace(side, precision="highest"), {}, **kwargs)
        still = []
        for failure in undecided:
            verdict = verdicts[failure["nodeid"]]
            if _passed(highest, failure):
                verdict["bucket"] = PRECISION
                verdict["evidence"].append('tpu with float32 matmul precision "highest": passed')
            else:
                verdict["evidence"].append('tpu with precision "highest": failed')
                still.append(failure)
        undecided = still

    if undecided and side.emulated:
        ideal = _rerun(root, directory / "ideal", undecided, replace(side, profile="ideal"), {}, **kwargs)
        for failure in undecided:
            verdict = verdicts[failure["nodeid"]]
            if _passed(ideal, failure):
                verdict["bucket"] = GAP
                verdict["evidence"].append("emulated TPU, profile ideal (CPU numerics, no gaps): passed")
            else:
                verdict["evidence"].append("emulated TPU, profile ideal: failed")

    for verdict in verdicts.values():
        if verdict["bucket"] is None:
            verdict["bucket"] = GAP if verdict["gap"] else UNTRIAGED
        if verdict["gap"]:
            verdict["evidence"].append(f"matches gap '{verdict['gap']}' (hf-tpu gaps --show {verdict['gap']})")
    return verdicts
