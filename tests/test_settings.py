"""The settings table is the one place hf-tpu reads the environment, and docs/settings.md is generated from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_tpu import settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_tpu"
# the shipped ragged-dot kernel is a package of its own (kernels loads it without hf-tpu); its variable is declared
KERNEL = PACKAGE / "kernels" / "ragged_dot_tpu"
# a read of the environment: os.getenv, os.environ.get, `in os.environ`, os.environ[...] not assigned to
_READ = re.compile(r"os\.getenv\(|os\.environ\.get\(|\bin os\.environ\b(?!\.)|os\.environ\[[^\]]+\](?!\s*=[^=])")


def _sources(*suffixes: str) -> list[Path]:
    return [p for p in PACKAGE.rglob("*") if p.suffix in suffixes and KERNEL not in p.parents]


def test_docs_settings_page_is_generated_from_the_table():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings.markdown(), "docs/settings.md is stale: python -m hf_tpu.settings > docs/settings.md"


def test_every_hf_tpu_variable_in_the_sources_is_declared():
    named = {m for p in _sources(".py", ".cpp", ".h", ".c") for m in re.findall(r"\bHF_TPU_[A-Z0-9_]+", p.read_text())}
    assert named - set(settings.BY_NAME) == set(), "declare these in hf_tpu/settings.py"


def test_the_environment_is_read_only_through_the_table():
    reads = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _sources(".py")
        if p.name != "settings.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _READ.search(line)
    ]
    assert not reads, "read these through hf_tpu.settings (get/text):\n" + "\n".join(reads)


def test_a_bad_value_names_the_variable_the_value_and_what_it_accepts(monkeypatch):
    monkeypatch.setenv("HF_TPU_STRICT_RECOMPILE", "2")
    with pytest.raises(settings.EnvError, match=r"HF_TPU_STRICT_RECOMPILE='2' is not a yes/no value: use 1"):
        settings.get("HF_TPU_STRICT_RECOMPILE")
    monkeypatch.setenv("HF_TPU_JOIN_TIMEOUT", "inf")
    with pytest.raises(settings.EnvError, match=r"HF_TPU_JOIN_TIMEOUT='inf': give a number of seconds"):
        settings.get("HF_TPU_JOIN_TIMEOUT")
    monkeypatch.setenv("HF_TPU_EMULATOR_GAPS", "Abort")
    assert settings.get("HF_TPU_EMULATOR_GAPS") == "abort"
    with pytest.raises(KeyError, match="not declared"):
        settings.text("HF_TPU_NOT_A_SETTING")
