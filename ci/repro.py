"""A repro per failure bucket: a standalone script, checked to fail the same way when run alone.

Where the failure came from one aten op that raised, the script calls that op on inputs of the
recorded shapes, dtypes, strides and devices, without transformers or diffusers. Otherwise it runs
the single test node with the exact environment of the failing run. Each script starts with what a
TorchTPU bug report needs: the versions, the device, the command.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .devices import Side, versions

VERIFY_TIMEOUT_S = 600

_HEADER = '''"""{title}

Bucket: {bucket}{gap}
Seen in {count} test(s), first: {nodeid}
Error on {device}: {message}
Versions: {versions}
Run: python {name}
"""
'''


def _env_lines(side: Side) -> str:
    lines = []
    for key, value in sorted(side.env(run_slow=False).items()):
        if key.startswith(("TRANSFORMERS_", "DIFFUSERS_")):
            continue
        lines.append(f"os.environ[{key!r}] = {value!r}")
    return "\n".join(lines)


def _arg(description: dict) -> str:
    if description.get("tensor"):
        return f"make({description['shape']}, {description['stride']}, torch.{description['dtype']}, {description['device']!r})"
    if "sequence" in description:
        items = ", ".join(_arg(d) for d in description["items"])
        return (
            f"[{items}]"
            if description["sequence"] == "list"
            else f"({items}{',' if len(description['items']) == 1 else ''})"
        )
    if "value" in description:
        return repr(description["value"])
    if "torch" in description:
        text = description["torch"]
        return f"torch.device({text!r})" if ":" in text or text in ("cpu", "tpu") else text
    raise ValueError(f"cannot rebuild argument {description}")


def op_script(name: str, verdict: dict, failure: dict, count: int, side: Side) -> str | None:
    """A script calling the one op that raised, or None when its arguments cannot be rebuilt."""
    op = verdict["op"]
    try:
        args = ", ".join(_arg(a) for a in op["args"])
        kwargs = ", ".join(f"{k}={_arg(v)}" for k, v in op["kwargs"].items())
    except ValueError:
        return None
    call = ", ".join(p for p in (args, kwargs) if p)
    packet, overload = op["op"].rsplit(".", 1) if op["op"].count(".") >= 2 else (op["op"], "default")
    return (
        _header(name, f"{op['op']} raises on {side.label()}", verdict, failure, count, side)
        + f"""
import os

{_env_lines(side)}

import torch


def make(shape, stride, dtype, device):
    # a tensor of this shape, stride, dtype and device, filled at random
    size = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    base = torch.randn(size) if dtype.is_floating_point or dtype.is_complex else torch.randint(0, 2, (size,))
    return base.to(dtype).to(device).as_strided(shape, stride)


torch.manual_seed(0)
torch.ops.{packet}.{overload}({call})
print("no error: the failure did not reproduce")
"""
    )


def node_script(name: str, verdict: dict, failure: dict, count: int, side: Side, root: Path) -> str:
    """A script running the single failing test with the failing run's environment."""
    env = {k: v for k, v in side.env(run_slow=False).items()}
    return (
        _header(name, f"{failure['nodeid'].split('::')[-1]} fails on {side.label()}", verdict, failure, count, side)
        + f"""
import os
import subprocess
import sys

ENV = {env!r}
SUITE = {str(root)!r}  # the test tree of the run (python -m ci fetched or was given it)
NODE = {failure["test"]!r}

env = dict(os.environ, **ENV)
code = subprocess.call([sys.executable, "-m", "pytest", NODE, "-q", "-p", "no:cacheprovider", "--rootdir", SUITE], cwd=SUITE, env=env)
sys.exit(code if code >= 0 else 128 - code)  # a test process killed by a signal: exit 128 + the signal, as a shell does
"""
    )


def _header(name: str, title: str, verdict: dict, failure: dict, count: int, side: Side) -> str:
    return _HEADER.format(
        title=title,
        bucket=verdict["bucket"],
        gap=f" (gap {verdict['gap']}: hf-tpu gaps --show {verdict['gap']})" if verdict["gap"] else "",
        count=count,
        nodeid=failure["nodeid"],
        device=side.label(),
        message=failure["message"][:300].replace('"""', "'''"),
        versions=", ".join(f"{k} {v}" for k, v in versions().items()),
        name=name,
    )


def bucket_key(verdict: dict, failure: dict) -> str:
    """Failures that share a bucket and a cause share a repro."""
    if verdict["op"]:
        cause = verdict["op"]["op"]
    elif verdict["gap"]:
        cause = verdict["gap"]
    else:
        # the same error, numbers aside, from the same test (its parameterizations and subtests together)
        test = re.sub(r"(_\d+(_\w*)?)?(\[.*)?$", "", failure["test"].split("::")[-1])
        cause = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", failure["message"])[:80] + " @ " + test
    return f"{verdict['bucket']} | {cause}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def verify(script: Path, expected: str) -> tuple[bool, str]:
    """Run a repro alone; True when it fails the way the test did (``expected``: the error's type, or
    "failed" for a test-node script: pytest reports it failed, or its process died)."""
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=VERIFY_TIMEOUT_S, cwd=script.parent
        )
    except subprocess.TimeoutExpired:
        return False, f"ran past {VERIFY_TIMEOUT_S} s"
    output = (done.stdout + done.stderr).strip()
    last = output.splitlines()[-1] if output else ""
    failed = done.returncode != 0
    killed = done.returncode >= 128 or done.returncode < 0  # the failure was a process death
    same = expected in output or (expected == "failed" and killed)
    return failed and same, f"exit {done.returncode}: {last[:200]}"


def write(
    out: Path, root: Path, failures: list[dict], verdicts: dict[str, dict], side: Side, check: bool = True
) -> list[dict]:
    """One script per bucket key under ``out/repros/``; each checked by running it when ``check``."""
    groups: dict[str, list[dict]] = {}
    for failure in failures:
        groups.setdefault(bucket_key(verdicts[failure["nodeid"]], failure), []).append(failure)
    directory = out / "repros"
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for index, (key, members) in enumerate(sorted(groups.items()), start=len(list(directory.glob("*.py"))) + 1):
        first = members[0]
        verdict = verdicts[first["nodeid"]]
        name = f"{index:02d}-{slug(key)}.py"
        script = op_script(name, verdict, first, len(members), side) if verdict["op"] else None
        kind = "op" if script else "test"
        if script is None:
            script = node_script(name, verdict, first, len(members), side, root)
        path = directory / name
        path.write_text(script, encoding="utf-8")
        expected = verdict["op"]["error"].split(":", 1)[0] if kind == "op" else "failed"
        reproduces, detail = verify(path, expected) if check else (None, "not checked")
        made.append(
            {
                "key": key,
                "script": str(path.relative_to(out)),
                "kind": kind,
                "tests": [m["nodeid"] for m in members],
                "reproduces": reproduces,
                "detail": detail,
            }
        )
    return made
