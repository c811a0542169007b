"""No process the suite (or hf-tpu) starts can hang it: every subprocess.run / check_output / check_call / call
passes a timeout, so a child that never ends fails its test instead of holding CI until its global limit."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
BLOCKING = {"run", "check_output", "check_call", "call"}


def _unbounded(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if node.func.attr in BLOCKING and isinstance(owner, ast.Name) and owner.id == "subprocess":
            if not any(keyword.arg == "timeout" for keyword in node.keywords):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_blocking_subprocess_call_has_a_timeout():
    files = [
        *ROOT.glob("hf_tpu/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("ci/**/*.py"),
        *ROOT.glob("bench/*.py"),
    ]
    unbounded = [where for path in files for where in _unbounded(path)]
    assert unbounded == [], f"subprocess calls without timeout=: {unbounded}"
