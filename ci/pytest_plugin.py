"""The pytest side of ``python -m ci``: loaded into every test process with ``-p ci.pytest_plugin``.

It writes what the harness reads back, in a form that survives the process dying:
- ``--ci-log PATH``: one JSON line per finished test phase (node id, outcome, duration, the error's
  last line and its trace), flushed as it happens, and ``PATH.current``: the test now running, so
  an abort is pinned on the test that caused it;
- ``--ci-reports DIR/reports/ID``: transformers' ``--make-reports`` files (``stats.txt``,
  ``summary_short.txt``, ``failures_line.txt``, ...), written by transformers' own
  ``pytest_terminal_summary_main`` so they parse like upstream's;
- ``HF_TPU_CI_PRECISION=highest``: float32 matmuls at full precision for every test (triage);
- ``HF_TPU_CI_RECORD_OPS=DIR``: per test, the aten op that raised, with its inputs' shapes, dtypes,
  strides and devices (``DIR/<test>.json``; triage, for a repro without transformers).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_log = None
_current_path = None
_recorded: dict[str, Any] | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hf-tpu ci")
    group.addoption("--ci-log", default=None, help="write one JSON line per test outcome here")
    group.addoption("--ci-reports", default=None, help="write transformers' --make-reports files to DIR/reports/ID")


def pytest_configure(config: pytest.Config) -> None:
    global _log, _current_path
    path = config.getoption("--ci-log")
    if path:
        _log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed at unconfigure)
        _current_path = path + ".current"
    _apply_precision()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _log is not None:
        _log.close()


def _apply_precision() -> None:
    precision = os.environ.get("HF_TPU_CI_PRECISION")
    if precision:
        import torch

        torch.set_float32_matmul_precision(precision)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    if _current_path is not None:
        with open(_current_path, "w", encoding="utf-8") as f:
            f.write(nodeid)
            f.flush()
            os.fsync(f.fileno())


def pytest_runtest_setup(item: pytest.Item) -> None:
    _apply_precision()  # a test (or a fixture before it) may have changed it


def _last_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.splitlines()[0] if crash.message else ""
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    text = str(report.longrepr or "")
    return text.strip().splitlines()[-1] if text.strip() else ""


def subtest_key(nodeid: str, description: str) -> str:
    """A subtest's own key: its test's node id and pytest's description, without spaces."""
    return f"{nodeid}[subtest:{description.replace(' ', '')}]"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _log is None:
        return
    context = getattr(report, "context", None)  # a subtest (unittest's subTest, pytest's subtests)
    if report.outcome == "passed" and (report.when != "call" or context is not None):
        return  # a phase or subtest that passed: pytest does not count it either
    outcome = report.outcome
    if report.when != "call" and outcome == "failed":
        outcome = "error"
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if outcome == "skipped" else "xpassed"
    entry = {
        "nodeid": subtest_key(report.nodeid, report._sub_test_description()) if context is not None else report.nodeid,
        "test": report.nodeid,  # what to run again
        "when": report.when,
        "outcome": outcome,
        "duration": round(report.duration, 3),
        "message": _last_line(report) if outcome in ("failed", "error", "skipped") else "",
        "line": getattr(getattr(report.longrepr, "reprcrash", None), "lineno", None),
        "trace": report.longreprtext[-4000:] if outcome in ("failed", "error") else "",
    }
    _log.write(json.dumps(entry) + "\n")
    _log.flush()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    target = terminalreporter.config.getoption("--ci-reports")
    if not target:
        return
    from pathlib import Path

    from transformers.testing_utils import pytest_terminal_summary_main

    target = Path(target).resolve()
    if target.parent.name != "reports":
        raise pytest.UsageError(f"--ci-reports {target}: must end in reports/<id> (transformers' layout)")
    cwd = os.getcwd()
    os.chdir(target.parent.parent)  # transformers writes to ./reports/<id>/
    try:
        pytest_terminal_summary_main(terminalreporter, id=target.name)
    finally:
        os.chdir(cwd)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _log is None or report.outcome != "failed":
        return
    entry = {
        "nodeid": report.nodeid,
        "test": report.nodeid,
        "when": "collect",
        "outcome": "error",
        "duration": 0.0,
        "message": _last_line(report),
        "trace": str(report.longrepr)[-4000:],
    }
    _log.write(json.dumps(entry) + "\n")
    _log.flush()


# -- the op that raised (triage) ----------------------------------------------------------------


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {
            "tensor": True,
            "shape": list(value.shape),
            "stride": list(value.stride()),
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "requires_grad": bool(value.requires_grad),
        }
    if isinstance(value, (list, tuple)):
        return {"sequence": type(value).__name__, "items": [_describe(v) for v in value]}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return {"value": value}
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return {"torch": str(value)}
    return {"unsupported": repr(value)[:200]}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    directory = os.environ.get("HF_TPU_CI_RECORD_OPS")
    if not directory:
        return (yield)
    import re

    from torch.utils._python_dispatch import TorchDispatchMode

    global _recorded
    _recorded = None
    path = os.path.join(directory, re.sub(r"[^A-Za-z0-9_.-]", "_", item.nodeid)[-200:] + ".json")

    class RecordRaisingOp(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            kwargs = kwargs or {}
            try:
                return func(*args, **kwargs)
            except BaseException as error:
                # the latest op to raise: a test may catch earlier errors on purpose; the triage
                # uses the record only when its error is the one the test failed with
                global _recorded
                _recorded = {
                    "op": str(func),
                    "args": [_describe(a) for a in args],
                    "kwargs": {k: _describe(v) for k, v in kwargs.items()},
                    "error": f"{type(error).__name__}: {_first_line(error)}",
                }
                os.makedirs(directory, exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(_recorded, f, indent=1)
                raise

    with RecordRaisingOp():
        return (yield)
