"""Running test files: one pytest process per file and side, so a process that aborts costs that file
its one test, not the run.

Each file's results go to ``<out>/<side>/files/<key>/``: ``log.jsonl`` (one line per test, written
as it finishes), the ``--make-reports`` files of each process (``reports/part<N>/``) and ``done.json``
when the file is finished. A rerun skips finished files. When a process dies (a signal, an exit code
pytest never returns, the file's time limit), the test it was running is recorded as failed with
what killed it, and the rest of the file runs in a new process without it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .devices import Side, child_env

PYTEST_CODES = {0, 1, 2, 5}  # passed, tests failed, interrupted (keyboard/-x), nothing collected
MAX_ABORTS_PER_FILE = 5


@dataclass(frozen=True)
class FileJob:
    suite: str  # "transformers" / "diffusers"
    family: str
    path: str  # relative to the suite root
    side: Side


def file_dir(out: Path, side: str, path: str) -> Path:
    """Where one test file's results for one side live."""
    return out / side / "files" / re.sub(r"[^A-Za-z0-9_.-]", "_", path.removesuffix(".py"))


def read_log(path: Path) -> list[dict]:
    """The JSON lines of a log; a line cut short by a dying process is dropped."""
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def _death(returncode: int | None, timed_out: bool, limit: float) -> str:
    if timed_out:
        return f"timeout: the test file ran past its limit of {limit:.0f} s and was killed"
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"process abort: killed by {name}"
    return f"process abort: exit code {returncode} (pytest never returns it)"


def pytest_command(
    root: Path, targets: list[str], log: Path, reports: Path | None, timeout: float, extra: list[str]
) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *targets, "-p", "ci.pytest_plugin", "-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(root), "-q", "-rA", "--tb=long", f"--timeout={timeout:g}", "--ci-log", str(log)]
    cmd += ["-W", "ignore::pytest.PytestUnknownMarkWarning"]
    if reports is not None:
        cmd += ["--ci-reports", str(reports)]
    return cmd + extra


def run_process(
    cmd: list[str], cwd: Path, env: dict[str, str], limit: float, stdout_path: Path
) -> tuple[int | None, bool, float]:
    """Run one pytest process in its own process group; kill the group at ``limit`` seconds."""
    start = time.monotonic()
    with open(stdout_path, "ab") as out:
        process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
            timed_out = True
    return returncode, timed_out, time.monotonic() - start


def run_targets(
    root: Path,
    directory: Path,
    targets: list[str],
    side: Side,
    *,
    timeout: float,
    limit: float,
    run_slow: bool,
    extra: list[str],
    threads: int,
    env_extra: dict[str, str] | None = None,
    reports: bool = True,
) -> tuple[int | None, list[dict], float]:
    """Run ``targets`` (files or node ids) to the end, surviving aborts; results in ``directory``.

    Returns the last exit code, the deaths (the test each dead process was running, and why) and the
    wall time."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "log.jsonl"
    for stale in (log, directory / "stdout.txt"):
        stale.unlink(missing_ok=True)
    env = child_env(side, run_slow, {"OMP_NUM_THREADS": str(threads), **(env_extra or {})})
    deaths: list[dict] = []
    wall = 0.0
    deadline = time.monotonic() + limit
    returncode: int | None = None
    for part in range(MAX_ABORTS_PER_FILE + 1):
        finished = {e.get("test", e["nodeid"]) for e in read_log(log)}
        deselect = [f"--deselect={node}" for node in sorted(finished | {d["nodeid"] for d in deaths})]
        current = Path(str(log) + ".current")
        current.unlink(missing_ok=True)
        part_reports = directory / "reports" / f"part{part}" if reports else None
        cmd = pytest_command(root, targets, log, part_reports, timeout, extra + deselect)
        returncode, timed_out, seconds = run_process(
            cmd, root, env, max(1.0, deadline - time.monotonic()), directory / "stdout.txt"
        )
        wall += seconds
        if returncode in PYTEST_CODES and not timed_out:
            break
        node = current.read_text(encoding="utf-8").strip() if current.is_file() else ""
        reason = _death(returncode, timed_out, limit)
        if not node or node in finished:  # died outside a test (collection, exit): nothing to skip past
            deaths.append({"nodeid": node or targets[0], "reason": reason, "returncode": returncode})
            break
        deaths.append({"nodeid": node, "reason": reason, "returncode": returncode})
        if timed_out:
            break
    return returncode, deaths, wall


def run_file(
    root: Path,
    out: Path,
    job: FileJob,
    *,
    timeout: float,
    file_timeout: float,
    run_slow: bool,
    extra: list[str],
    threads: int,
) -> dict:
    """Run one test file on one side (skipped when a previous run finished it); its ``done.json`` record."""
    directory = file_dir(out, job.side.device, job.path)
    done_path = directory / "done.json"
    if done_path.is_file():
        return json.loads(done_path.read_text())
    returncode, deaths, wall = run_targets(
        root,
        directory,
        [job.path],
        job.side,
        timeout=timeout,
        limit=file_timeout,
        run_slow=run_slow,
        extra=extra,
        threads=threads,
    )
    record = {
        "suite": job.suite,
        "family": job.family,
        "path": job.path,
        "side": job.side.device,
        "returncode": returncode,
        "deaths": deaths,
        "wall_s": round(wall, 2),
    }
    done_path.write_text(json.dumps(record, indent=1))
    return record


def run_all(
    jobs: list[tuple[Path, FileJob]], out: Path, *, workers: int, serial_tpu: bool, progress=print, **kwargs
) -> list[dict]:  # noqa: ANN001
    """Run every job, ``workers`` at a time; a real TPU's jobs one at a time (one process owns its chips)."""
    tpu_lock = threading.Lock()
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    done_count = [0]
    count_lock = threading.Lock()

    def one(item: tuple[Path, FileJob]) -> dict:
        root, job = item
        if serial_tpu and job.side.device == "tpu":
            with tpu_lock:
                record = run_file(root, out, job, threads=threads, **kwargs)
        else:
            record = run_file(root, out, job, threads=threads, **kwargs)
        with count_lock:
            done_count[0] += 1
            dead = f", {len(record['deaths'])} abort(s)/timeout(s) contained" if record["deaths"] else ""
            progress(f"[{done_count[0]}/{len(jobs)}] {job.side.device} {job.path}: {record['wall_s']:.0f} s{dead}")
        return record

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, jobs))
