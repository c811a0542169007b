"""The CI harness's parts, fast: report parsing and the dashboard schema, triage rules, repro scripts, and a test
process that aborts. The harness on upstream's suites runs in its own job (tests/harness, ``make harness``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from ci import repro, results, summary, triage
from ci.devices import Side
from ci.runner import read_log, run_targets

CPU = Side("cpu", emulated=False)


def test_stats_lines_parse_like_the_dashboard() -> None:
    counts, seconds = results.parse_stats(
        "==== 4 failed, 113 passed, 52 skipped, 15 warnings, 2 errors, 847 subtests passed in 14.52s ===="
    )
    assert (counts["failed"], counts["passed"], counts["skipped"], counts["error"], seconds) == (4, 113, 52, 2, 14.52)
    line = results.stats_line(Counter(failed=1, passed=3, error=2), 1.5)
    assert line == "==== 1 failed, 3 passed, 2 errors in 1.50s ====" and results.parse_stats(line)[0]["error"] == 2


def test_summary_short_lists_failures_and_subtests() -> None:
    text = "FAILED t.py::T::test_a - AssertionError\nERROR t.py::T::test_b - RuntimeError\nSUBFAILED(i=2) t.py::T::test_c - x\nPASSED t.py::T::test_d\n"
    assert results.listed_keys(text) == {"t.py::T::test_a", "t.py::T::test_b", "t.py::T::test_c[subtest:(i=2)]"}


def test_model_results_schema() -> None:
    tests = {
        "tests/models/x/test_modeling_x.py::XTest::test_ok": {"outcome": "passed"},
        "tests/models/x/test_modeling_x.py::XTest::test_bad": {
            "outcome": "failed",
            "message": "AssertionError: no",
            "line": 41,
        },
        "tests/models/x/test_tokenization_x.py::XTok::test_t": {
            "outcome": "failed",
            "message": "ValueError: v",
            "line": None,
        },
        "tests/models/x/test_modeling_x.py::XTest::test_skip": {"outcome": "skipped"},
        "tests/models/x/test_modeling_x.py::XTest::test_err": {"outcome": "error", "message": "E"},
    }
    tests = {k: dict(v, nodeid=k, family="x") for k, v in tests.items()}
    records = [{"side": "tpu", "family": "x", "wall_s": 3.5, "deaths": []}]
    entry = results.model_results(tests, records, "tpu", "multi-gpu")["models_x"]
    assert set(entry) == {
        "failed",
        "errors",
        "success",
        "skipped",
        "time_spent",
        "error",
        "failures",
        "job_link",
        "captured_info",
    }
    assert (entry["success"], entry["skipped"], entry["errors"], entry["time_spent"], entry["error"]) == (
        1,
        1,
        1,
        [3.5],
        False,
    )
    assert entry["failed"]["PyTorch"] == {"unclassified": 0, "single": 0, "multi": 1}
    assert entry["failed"]["Tokenizers"]["multi"] == 1 and results.failed_total(entry) == 2
    assert entry["failures"]["multi"][0] == {
        "line": "tests/models/x/test_modeling_x.py::XTest::test_bad",
        "trace": "(line 42)  AssertionError: no",
    }


def test_tpu_only_is_split_from_failures_cpu_shares() -> None:
    tests = {
        "a": {"tpu": "failed", "cpu": "passed"},
        "b": {"tpu": "failed", "cpu": "failed"},
        "c": {"tpu": "failed", "cpu": "skipped"},
        "d": {"tpu": "passed", "cpu": "failed"},
        "t": {"tpu": "passed", "cpu": "passed"},
        "t[subtest:(i=1)]": {"tpu": "failed", "test": "t"},  # a subtest is logged only where it fails
    }
    groups = summary.compare(tests)
    assert groups == {"tpu_only": ["a", "t[subtest:(i=1)]"], "shared": ["b"], "no_baseline": ["c"], "cpu_only": ["d"]}


def test_rules_and_gap_names() -> None:
    assert (
        triage.rule_bucket("NotImplementedError: 'aten::linalg_cholesky_ex' is not implemented for TPU")
        == "op not implemented"
    )
    assert triage.rule_bucket("process abort: killed by SIGABRT") == "process abort"
    assert triage.rule_bucket("Failed: Timeout >300.0s") == "timeout"
    assert triage.rule_bucket("AssertionError: Tensor-likes are not close!") is None
    assert triage.gap_named("'aten::linalg_cholesky_ex' is not implemented for TPU") == "cholesky"
    assert triage.gap_named("RuntimeError: TorchTPU aborts the process here (known gap 'ctc_loss'): ...") == "ctc_loss"
    assert triage.gap_named("AssertionError: 1 != 2") is None


def test_parameterizations_share_a_repro() -> None:
    verdict = {"bucket": "float32 precision", "op": None, "gap": None}
    keys = {
        repro.bucket_key(
            verdict,
            {
                "test": f"f.py::T::test_eager_matches_sdpa_inference_{i:02d}_fp32_pad_left",
                "message": f"mean relative difference: {d}",
            },
        )
        for i, d in ((8, 9.8e-4), (10, 1.2e-3))
    }
    assert keys == {"float32 precision | mean relative difference: N @ test_eager_matches_sdpa_inference"}


def test_op_repro_rebuilds_the_inputs_and_fails_the_same_way(tmp_path: Path) -> None:
    tensor = {"tensor": True, "stride": [3, 1], "dtype": "float32", "device": "cpu", "requires_grad": False}
    verdict = {
        "bucket": "needs triage",
        "gap": None,
        "op": {
            "op": "aten.mm.default",
            "args": [dict(tensor, shape=[2, 3]), dict(tensor, shape=[4, 3])],
            "kwargs": {},
            "error": "RuntimeError: mat1 and mat2 shapes cannot be multiplied",
        },
    }
    failure = {
        "nodeid": "f.py::T::test_x",
        "test": "f.py::T::test_x",
        "message": "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x3)",
    }
    made = repro.write(tmp_path, tmp_path, [failure], {failure["nodeid"]: verdict}, CPU)
    assert made[0]["kind"] == "op" and made[0]["reproduces"] is True, made
    script = (tmp_path / made[0]["script"]).read_text()
    assert (
        "torch.ops.aten.mm.default(make([2, 3], [3, 1], torch.float32, 'cpu'), make([4, 3], [3, 1], torch.float32, 'cpu'))"
        in script
    )


def test_an_aborting_test_costs_one_test(tmp_path: Path) -> None:
    (tmp_path / "test_planted.py").write_text(
        textwrap.dedent(
            """
            import os

            def test_1():
                pass

            def test_2():
                os.abort()

            def test_3():
                assert False, "planted"
            """
        )
    )
    returncode, deaths, _ = run_targets(
        tmp_path,
        tmp_path / "out",
        ["test_planted.py"],
        CPU,
        timeout=60,
        limit=120,
        run_slow=False,
        extra=[],
        threads=1,
        reports=False,
    )
    assert returncode == 1  # the second process ran test_3, which fails
    assert deaths == [
        {"nodeid": "test_planted.py::test_2", "reason": "process abort: killed by SIGABRT", "returncode": -6}
    ]
    outcomes = {e["nodeid"]: e["outcome"] for e in read_log(tmp_path / "out" / "log.jsonl")}
    assert outcomes == {"test_planted.py::test_1": "passed", "test_planted.py::test_3": "failed"}


def _ci(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ci", *args], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1]
    )


def test_cli_names_bad_arguments() -> None:
    done = _ci("run", "--jobs", "0")
    assert done.returncode == 2 and "--jobs '0': must be > 0" in done.stderr
    done = _ci("show", "/nonexistent")
    assert done.returncode == 1 and "no results.json there" in done.stderr
    done = _ci("run", "--devices", "gpu")
    assert done.returncode == 1 and "--devices 'gpu': use tpu, cpu or tpu,cpu" in done.stderr
