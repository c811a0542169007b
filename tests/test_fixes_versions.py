"""A patch finds its target in the library version it meets, says when that version needs none, and warns (never
silently does nothing) when it cannot find it. pytest (installed, imported) stands in for the library."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
import torch

from hf_tpu import fixes
from hf_tpu.fixes import Fix


def _noop(module: object) -> None:
    """pytest: a patch that changes nothing."""


def _fresh(module: str, targets: dict[str, str | None] | None = None) -> Fix:
    fix = Fix.patch("T1", module, _noop, targets=targets)
    fix.name = f"probe_{abs(hash((module, str(targets))))}"
    return fix


def test_a_version_that_fixed_the_gap_needs_no_patch():
    fix = _fresh("pytest.python", {"<1": "pytest.python", ">=1": None})
    fixes.install(fix)
    assert fix.state == f"not needed: pytest {pytest.__version__} does it itself"


def test_each_version_gets_its_own_target():
    fix = _fresh("pytest.old_place", {"<1": "pytest.old_place", ">=1": "_pytest.python"})
    fixes.install(fix)
    assert fix.module == "_pytest.python" and fix.state == "applied"  # already imported: applied at once


def test_a_target_the_library_lacks_is_a_warning_not_a_silent_no_op():
    fix = _fresh("pytest.no_such_module")
    with pytest.warns(
        RuntimeWarning, match=r"could not find its target: pytest .* has no module pytest.no_such_module"
    ):
        fixes.install(fix)
    assert fix.state.startswith("failed: ")


def test_a_version_newer_than_the_table_is_a_warning():
    fix = _fresh("pytest.python", {"<1": "pytest.python"})
    with pytest.warns(RuntimeWarning, match=r"pytest .* is newer than the versions it knows \(<1\)"):
        fixes.install(fix)
    assert fix.state.startswith("failed: ")


def test_kernels_picks_tpu_builds_with_or_without_the_patch():
    # kernels_cannot_see_the_tpu on the version that has it (kernels < 0.18 looks for torch.backends.tpu): without the marker, CPU builds.
    # From 0.18, kernels asks torch.accelerator itself and hf-tpu's patch stands down.
    fix = fixes.get("kernels_tpu_backend")
    backends = importlib.import_module(
        "kernels._internals.backends" if importlib.util.find_spec("kernels._internals") else "kernels.backends"
    )
    marker = torch.backends.__dict__.pop("tpu", None)
    try:
        expected = "tpu" if fix.state.startswith("not needed") else "cpu"
        assert backends._backend().name == expected, fix.state
    finally:
        if marker is not None:
            torch.backends.tpu = marker
    assert backends._backend().name == "tpu"
