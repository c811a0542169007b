"""PyTorch's OpInfo database on the emulated TPU vs CPU, one test per OpInfo, with a checked-in list of the
known failures and how many samples of each fail, and the operators the real wheel refuses (its op-coverage table,
``hf_tpu/emulator/op_coverage/``): the emulator must refuse exactly those, no more (a false red) and no fewer (a
false green), except where an hf-tpu workaround takes the operator off the device."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from torch.testing._internal.common_methods_invocations import op_db

from hf_tpu.emulator import op_coverage
from hf_tpu.emulator.gaps import RELEASE
from hf_tpu.gaps import GAPS
from tests.emulator.opinfo_sweep import DTYPES, _key, sweep

pytestmark = pytest.mark.emulator_only(
    "the emulator's op-by-op sweep against CPU (its known differences are the emulator's)"
)

EXPECTED = Path(__file__).with_name("opinfo_expected_failures.txt")
SAMPLE_INPUTS = "sample_inputs"  # the count field of a key whose sample_inputs itself raises
REFUSAL = re.compile(r"'(aten::\w+)(?:\.\w+)?' is not implemented for TPU")
# operators hf-tpu's workarounds run on the host (the sweep runs ops as users get them, workarounds on)
WORKED_AROUND = {
    "aten::" + op.split(".")[1] for gap in GAPS if gap.workaround for op in gap.ops if op.startswith("aten.")
}


def refused_by_the_real_wheel(key: str) -> set[str] | None:
    """Operators (no overload) the real wheel refused for this OpInfo and dtype, minus those worked around; None
    where XLA:CPU's runtime failed or the process died first, so the real wheel's answer is not known."""
    table = op_coverage.table(RELEASE)
    status = table["ops"].get(key, table["ops"].get(key.split("|")[0] + "|*", {})).get("status")
    if status in ("xla_cpu", "aborts", "timeout"):
        return None
    return {name.split(".")[0] for name, keys in table["refused_operators"].items() if key in keys} - WORKED_AROUND


def load_expected() -> dict[str, int | str]:
    """``<key> x<failing samples>  # reason`` (or ``<key> sample_inputs  # reason``) per line."""
    expected: dict[str, int | str] = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        entry, _, reason = line.partition("#")
        match = re.fullmatch(r"(\S+)\s+(x\d+|sample_inputs)", entry.strip())
        assert match, f"{EXPECTED.name}: {line!r} is not '<op>|<dtype> x<count>  # reason'"
        assert reason.strip(), f"{EXPECTED.name}: {match[1]} needs a reason"
        count = match[2]
        expected[match[1]] = SAMPLE_INPUTS if count == SAMPLE_INPUTS else int(count[1:])
    return expected


def _id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def test_every_listed_failure_names_an_op_of_the_database():
    keys = {_key(op, dtype) for op in op_db for dtype in DTYPES}
    assert not sorted(set(load_expected()) - keys)


def test_the_profile_refuses_what_the_real_wheel_refused():
    table = op_coverage.table(RELEASE)
    assert table["torch_tpu"] == RELEASE, f"no op-coverage table for TorchTPU {RELEASE}: python scripts/op_coverage.py"
    keys = {_key(op, dtype) for op in op_db for dtype in DTYPES}
    assert not sorted({key for key in table["ops"] if not key.endswith("|*")} - keys)  # a table of this torch's ops
    assert op_coverage.refused_operators(RELEASE) == sorted({n.split(".")[0] for n in table["refused_operators"]})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", op_db, ids=[_id(op) for op in op_db])
def test_op_matches_cpu(op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = sweep([op])
    expected = load_expected()
    for r in results:
        listed = expected.get(r.key)
        refusals = [match[1] for error in r.errors if (match := REFUSAL.search(error))]
        real = refused_by_the_real_wheel(r.key)
        if real is None:  # not known for this key: what the emulator refuses, the real wheel refused elsewhere
            assert set(refusals) <= set(op_coverage.refused_operators(RELEASE)), r.key
        else:
            assert set(refusals) == real, (
                f"{r.key}: the emulator refuses {sorted(set(refusals))}, the real wheel {sorted(real)}"
            )
        failed = r.failed - len(refusals)
        other = next((error for error in r.errors if not REFUSAL.search(error)), "")
        if r.sample_error:
            assert listed == SAMPLE_INPUTS, f"{r.key}: {r.sample_error} (list it as '{r.key} sample_inputs  # why')"
        elif failed:
            assert listed == failed, (
                f"{r.key}: {failed} of {r.passed + r.failed} samples differ from CPU (listed: {listed}); first: {other}"
            )
        else:
            assert listed is None, f"{r.key}: listed as failing ({listed}) but every sample now agrees with CPU"
