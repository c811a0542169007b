"""PyTorch's OpInfo database on the emulated TPU vs CPU, one test per OpInfo, with a checked-in list of the
known failures and how many samples of each fail."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from torch.testing._internal.common_methods_invocations import op_db

from tests.emulator.opinfo_sweep import DTYPES, _key, sweep

pytestmark = pytest.mark.emulator_only(
    "the emulator's op-by-op sweep against CPU (its known differences are the emulator's)"
)

EXPECTED = Path(__file__).with_name("opinfo_expected_failures.txt")
SAMPLE_INPUTS = "sample_inputs"  # the count field of a key whose sample_inputs itself raises


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


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", op_db, ids=[_id(op) for op in op_db])
def test_op_matches_cpu(op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = sweep([op])
    expected = load_expected()
    for r in results:
        listed = expected.get(r.key)
        if r.sample_error:
            assert listed == SAMPLE_INPUTS, f"{r.key}: {r.sample_error} (list it as '{r.key} sample_inputs  # why')"
        elif r.failed:
            assert listed == r.failed, (
                f"{r.key}: {r.failed} of {r.passed + r.failed} samples differ from CPU (listed: {listed}); first: "
                f"{r.first_error}"
            )
        else:
            assert listed is None, f"{r.key}: listed as failing ({listed}) but every sample now agrees with CPU"
