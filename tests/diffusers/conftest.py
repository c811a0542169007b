"""Tiny pipelines (see pipelines.py) saved once per session, loaded back with from_pretrained."""

from __future__ import annotations

import diffusers  # noqa: F401  (a hard dependency: imported, never skipped)
import pytest

from tests.diffusers.pipelines import BUILDERS


@pytest.fixture(scope="session")
def pipeline_dir(tmp_path_factory):
    """``pipeline_dir("sd3")``: the saved tiny pipeline (built on first use)."""
    built = {}

    def get(name: str):
        if name not in built:
            built[name] = tmp_path_factory.mktemp(name)
            BUILDERS[name](built[name])
        return built[name]

    return get
