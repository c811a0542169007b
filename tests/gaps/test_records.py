"""One gap, one place: each gap's record, probe, emulation and workaround are found from its name."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from hf_tpu import workarounds
from hf_tpu.gaps import BY_NAME, GAPS, markdown, probe

ROOT = Path(__file__).resolve().parents[2]


def test_every_workaround_closes_a_recorded_gap_and_the_record_names_it():
    declared = {fix.name: fix for fix in workarounds.declared()}
    for gap in GAPS:
        if gap.workaround:
            assert declared[gap.workaround].gap == gap.name, gap.name
    assert {fix.gap for fix in declared.values()} <= set(BY_NAME)


def test_a_workaround_module_is_named_after_its_gap():
    named = 0
    for info in pkgutil.iter_modules(workarounds.__path__):
        module = importlib.import_module(f"{workarounds.__name__}.{info.name}")
        for fix in getattr(module, "WORKAROUNDS", ()):
            # attention.py closes three gaps of scaled_dot_product_attention with one wrapper
            assert info.name in (fix.gap, "attention"), f"{module.__name__} declares {fix.name} for {fix.gap}"
            named += 1
    assert named == len(workarounds.declared())


def test_every_gap_has_a_probe():
    assert all(probe(gap.name).strip() for gap in GAPS)


@pytest.mark.emulator_only("the emulator's C++ core cannot load beside the real wheel")
def test_the_cores_gaps_are_the_records_marked_core():
    from hf_tpu.emulator import _build

    in_core = sorted(gap.name for gap in GAPS if gap.emulation == "core")
    assert sorted(_build.load().gap_names()) == in_core


def test_docs_gap_table_is_generated_from_the_records():
    assert markdown() in (ROOT / "docs" / "gaps.md").read_text(), "python -m hf_tpu.gaps, into docs/gaps.md"
