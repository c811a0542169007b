"""Op coverage of the real TorchTPU wheel: PyTorch's OpInfo database run on torch-tpu (XLA:CPU) against CPU.

    python scripts/op_coverage.py run [OP ...]   # the sweep, in the xla-cpu environment (~25 min on 2 cores)
    python scripts/op_coverage.py table          # writes hf_tpu/emulator/op_coverage/torch_tpu-<version>.json

``run`` starts workers in the xla-cpu environment (``python -m tests.environments xla-cpu``) with
``HF_TPU_XLA_CPU=1`` and hf-tpu's workarounds off (``HF_TPU_WORKAROUNDS=0``: TorchTPU's own answers; XLA:CPU's own
limits stay worked around). Each worker runs the sweep of ``tests/emulator/opinfo_sweep.py`` one OpInfo at a
time and appends a JSON line per op and dtype to ``build/op_coverage/results.jsonl``; an op that takes its
worker's process down (an abort) or runs past the per-op limit is recorded as such, and the worker restarts after
it. A second ``run`` skips the ops already recorded.

``table`` sorts every op and dtype into: ``agrees`` (every sample within XLA:CPU's rounding of CPU), ``refused``
(TorchTPU raises "'<op>' is not implemented for TPU" - the aten operators named are what the emulator's
``torch_tpu`` profile refuses), ``on_cpu`` (an output comes back on the CPU), ``dtype`` (an output of another
dtype than CPU's), ``differs`` (a value beyond the tolerances below), ``errors`` (another error on the wheel), ``aborts``, ``timeout``; ``cpu_only`` (every sample
fails on CPU too) and ``sample_error`` are counted apart. Random ops (CPU gives other values for another seed) are
compared by shape and dtype only: TorchTPU's generator is not CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "build" / "op_coverage" / "results.jsonl"
VERSIONS = RESULTS.with_name("versions.json")  # the wheel's and torch's, as the workers found them
TABLES = ROOT / "hf_tpu" / "emulator" / "op_coverage"
PER_OP_SECONDS = 300.0
# XLA:CPU's rounding: its transcendental functions are polynomial approximations (a few float32 ulp) and it sums
# in another order; bfloat16 ops compute in float32 and round once, as CPU's mostly do.
TOLERANCES = {"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 1.6e-2)}
REFUSED = re.compile(r"'(aten::[\w.]+)' is not implemented for TPU")
# XLA:CPU's runtime, not TorchTPU: a program it fails to compile or run, and the buffers that failure poisons
XLA_CPU_RUNTIME = re.compile(r"the XLA compiler failed|in a failed state|no FFI handler registered")


def _seeded(op) -> bool:
    """The OpInfo seeds torch's generator around each call (``wrapper_set_seed``): its values come from the
    device's generator, which on TorchTPU is not CPU's."""
    code = getattr(op.op, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _worker(indices: list[int]) -> None:
    """Runs in the xla-cpu environment: one JSON line per (op, dtype), a ``start`` line before each op."""
    import warnings

    import torch

    sys.path.insert(0, str(ROOT))
    from tests.emulator import opinfo_sweep

    warnings.simplefilter("ignore")
    opinfo_sweep.TOLERANCES = {getattr(torch, k): v for k, v in TOLERANCES.items()}
    from torch.testing._internal.common_methods_invocations import op_db

    def is_random(op, dtype) -> bool:
        """CPU gives other values for another seed (in one of the first 10 samples): the op draws random numbers."""
        try:
            for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
                if i == 10:
                    return False
                outputs = []
                for seed in (0, 1):
                    torch.manual_seed(seed)
                    outputs.append(torch.utils._pytree.tree_leaves(op(sample.input, *sample.args, **sample.kwargs)))
                if any(
                    isinstance(x, torch.Tensor) and x.shape == y.shape and not torch.equal(x, y)
                    for x, y in zip(*outputs, strict=False)
                ):
                    return True
        except Exception:
            return False
        return False

    from importlib.metadata import version

    out = sys.stdout
    out.write(json.dumps({"versions": {"torch_tpu": version("torch-tpu"), "torch": torch.__version__}}) + "\n")
    for index in indices:
        op = op_db[index]
        key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        out.write(json.dumps({"start": index, "op": key}) + "\n")
        out.flush()
        for dtype in opinfo_sweep.DTYPES:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            random = op.name not in opinfo_sweep.UNINITIALISED and (_seeded(op) or is_random(op, dtype))
            if random:
                opinfo_sweep.UNINITIALISED.add(op.name)
            started = time.monotonic()
            try:
                result = opinfo_sweep.sweep_one(op, dtype)
            finally:
                if random:
                    opinfo_sweep.UNINITIALISED.discard(op.name)
            record = {
                "index": index,
                "key": result.key,
                "passed": result.passed,
                "failed": result.failed,
                "cpu_failed": result.cpu_failed,
                "sample_error": result.sample_error,
                "errors": sorted(set(result.errors))[:8],
                "random": random,
                "seconds": round(time.monotonic() - started, 2),
            }
            out.write(json.dumps(record) + "\n")
            out.flush()
        out.write(json.dumps({"done": index}) + "\n")
        out.flush()


def _recorded() -> tuple[set[int], list[dict]]:
    lines = RESULTS.read_text().splitlines() if RESULTS.exists() else []
    records = [record for line in lines if line.strip() and "key" in (record := json.loads(line))]
    return {r["index"] for r in records if "index" in r} | {r["op_index"] for r in records if "op_index" in r}, records


def _spawn(python: str, indices: list[int]) -> subprocess.Popen:
    env = {**os.environ, "HF_TPU_XLA_CPU": "1", "HF_TPU_WORKAROUNDS": "0", "PYTHONPATH": str(ROOT)}
    env.pop("HF_TPU_EMULATE", None)
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from scripts.op_coverage import _worker; _worker({indices!r})"
    )
    return subprocess.Popen(
        [python, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT
    )


def run(names: list[str], workers: int) -> None:
    """The sweep on the real wheel, resumable, crash-proof, ``workers`` processes side by side."""
    import selectors

    python = subprocess.run(
        [sys.executable, "-m", "tests.environments", "xla-cpu"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    from torch.testing._internal.common_methods_invocations import op_db

    done, _ = _recorded()
    todo = [i for i, op in enumerate(op_db) if (not names or op.name in names) and i not in done]
    queues = [todo[k::workers] for k in range(workers)]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    sink = RESULTS.open("a")
    _say(f"op coverage: {len(todo)} OpInfos to run on the real wheel, {workers} workers")
    sel = selectors.DefaultSelector()
    state = {}  # proc -> [queue, current index, last progress]

    def start(queue: list[int]) -> None:
        if queue:
            proc = _spawn(python, queue)
            os.set_blocking(proc.stdout.fileno(), False)
            state[proc] = [queue, None, time.monotonic(), ""]
            sel.register(proc.stdout, selectors.EVENT_READ, proc)

    def finish(proc: subprocess.Popen, outcome: str) -> None:
        queue, current = state.pop(proc)[:2]
        sel.unregister(proc.stdout)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if current is not None:
            op = op_db[current]
            key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            sink.write(json.dumps({"op_index": current, "key": key, "outcome": outcome}) + "\n")
            sink.flush()
            _say(f"  {key}: {outcome}")
            start(queue[queue.index(current) + 1 :])

    for queue in queues:
        start(queue)
    finished = 0
    while state:
        for sk, _ in sel.select(timeout=5):
            proc = sk.data
            st = state[proc]
            chunk = proc.stdout.read() or ""
            if not chunk and proc.poll() is not None:
                finish(proc, "aborts" if st[1] is not None else "done")
                continue
            st[3] += chunk
            *lines, st[3] = st[3].split("\n")
            for line in lines:
                if not line.startswith("{"):
                    continue
                record = json.loads(line)
                st[2] = time.monotonic()
                if "versions" in record:
                    VERSIONS.write_text(json.dumps(record["versions"]) + "\n")
                elif "start" in record:
                    st[1] = record["start"]
                elif "done" in record:
                    st[1] = None
                    finished += 1
                    if finished % 20 == 0:
                        _say(f"  {finished}/{len(todo)} OpInfos")
                else:
                    sink.write(line + "\n")
                    sink.flush()
        for proc, st in list(state.items()):
            if st[1] is not None and time.monotonic() - st[2] > PER_OP_SECONDS:
                finish(proc, "timeout")
            elif proc.poll() is not None and not proc.stdout.readable():
                finish(proc, "aborts" if st[1] is not None else "done")
    sink.close()


def _classify(record: dict, seeded: bool) -> str:
    if "outcome" in record:
        return record["outcome"]
    if record["sample_error"]:
        return "sample_error"
    if not record["failed"]:
        return "agrees" if record["passed"] else "cpu_only"
    errors = record["errors"]
    if any(REFUSED.search(e) for e in errors):
        return "refused"
    if any("output on cpu" in e for e in errors):
        return "on_cpu"
    if any("attribute 'dtype' do not match" in e for e in errors):
        return "dtype"
    if all(e.startswith("AssertionError") for e in errors):
        return "random" if seeded or record.get("random") else "differs"
    if any(XLA_CPU_RUNTIME.search(e) for e in errors):
        return "xla_cpu"
    return "errors"


def table() -> Path:
    """The coverage table the emulator's ``torch_tpu`` profile reads, from ``run``'s results."""
    versions = json.loads(VERSIONS.read_text())
    wheel = versions["torch_tpu"]
    _, records = _recorded()
    by_key: dict[str, dict] = {}
    for record in records:
        if "outcome" in record:  # the whole OpInfo (every dtype) took the worker down
            by_key[f"{record['key']}|*"] = record
        else:
            by_key[record["key"]] = record
    from torch.testing._internal.common_methods_invocations import op_db

    seeded = {op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") for op in op_db if _seeded(op)}
    ops: dict[str, dict] = {}
    refused: dict[str, list[str]] = defaultdict(list)
    for key, record in sorted(by_key.items()):
        status = _classify(record, key.split("|")[0] in seeded)
        entry = {"status": status}
        if status not in ("agrees", "cpu_only"):
            entry["failed"] = record.get("failed", 0)
            entry["of"] = record.get("failed", 0) + record.get("passed", 0)
            entry["error"] = (record.get("errors") or [record.get("sample_error") or record.get("outcome", "")])[0]
        for error in record.get("errors", []):
            match = REFUSED.search(error)
            if match and key not in refused[match[1]]:
                refused[match[1]].append(key)
        ops[key] = entry
    counts = Counter(entry["status"] for entry in ops.values())
    data = {
        "torch_tpu": wheel,
        "measured": f"{time.strftime('%Y-%m-%d')}, the real wheel on XLA:CPU (HF_TPU_XLA_CPU=1), workarounds off, "
        f"torch {versions['torch']}, scripts/op_coverage.py",
        "tolerances": TOLERANCES,
        "counts": dict(sorted(counts.items())),
        "refused_operators": {name: keys for name, keys in sorted(refused.items())},
        "ops": ops,
    }
    TABLES.mkdir(parents=True, exist_ok=True)
    path = TABLES / f"torch_tpu-{wheel}.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    _say(f"{path.relative_to(ROOT)}: {dict(sorted(counts.items()))}; {len(refused)} aten operators refused")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the OpInfo sweep on the real wheel (resumable)")
    p.add_argument("ops", nargs="*", help="OpInfo names (default: all)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    sub.add_parser("table", help="write the coverage table from the results")
    args = parser.parse_args()
    if args.command == "run":
        run(args.ops, args.workers)
    else:
        table()


if __name__ == "__main__":
    main()
