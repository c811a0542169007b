"""Where a run's tests come from: a checkout, or the installed version's tests fetched and cached.

Fetching tries the release's git tag (a full test tree) and falls back to the PyPI sdist when GitHub
cannot be reached. The sdists carry only part of the tree (transformers: the common test mixins, no
``tests/models/``; diffusers: ``tests/testing_utils.py``), so hf-tpu overlays small model testers
of its own (``ci/overlays/<suite>/``) on a fetched tree, never over a file the tree has. A checkout
is used as it is: nothing is written into it.
"""

from __future__ import annotations

import ast
import fcntl
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SUITES = ("transformers", "diffusers")
OVERLAYS = Path(__file__).parent / "overlays"
FETCH_TIMEOUT_S = 300

# Families each suite runs when none are named: upstream's IMPORTANT_MODELS when the tree has it,
# else the families hf-tpu keeps testers for.
DEFAULT_FAMILIES = {"transformers": ("qwen3", "llama", "qwen3_moe"), "diffusers": ("sd3", "flux")}
# diffusers names its test files after the model class and its pipelines after the pipeline
DIFFUSERS_PATTERNS = {
    "sd3": ("tests/models/transformers/test_models_transformer_sd3.py", "tests/pipelines/stable_diffusion_3/test_*.py"),
    "flux": ("tests/models/transformers/test_models_transformer_flux.py", "tests/pipelines/flux/test_pipeline_flux.py"),
}


class SuiteError(RuntimeError):
    """A suite that cannot be found, fetched or selected from; the message says what to do."""


@dataclass
class Suite:
    name: str  # "transformers" or "diffusers"
    root: Path  # the directory holding tests/
    version: str
    source: str  # where the tests came from, for the report
    overlaid: list[str] = field(default_factory=list)  # files hf-tpu supplied

    def families(self) -> list[str]:
        """Every family this tree can run."""
        if self.name == "transformers":
            models = self.root / "tests" / "models"
            return (
                sorted(p.name for p in models.iterdir() if p.is_dir() and not p.name.startswith("_"))
                if models.is_dir()
                else []
            )
        return sorted(DIFFUSERS_PATTERNS)

    def important_models(self) -> list[str]:
        """Upstream's ``IMPORTANT_MODELS`` (``utils/important_files.py``) when the tree has it."""
        path = self.root / "utils" / "important_files.py"
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", None) == "IMPORTANT_MODELS" for t in node.targets
                ):
                    return [str(v) for v in ast.literal_eval(node.value)]
        return list(DEFAULT_FAMILIES[self.name])

    def files(self, family: str, pattern: str = "test_*.py") -> list[str]:
        """The test files of one family, relative to the root."""
        if self.name == "transformers":
            directory = self.root / "tests" / "models" / family
            if not directory.is_dir():
                raise SuiteError(
                    f"--models: no family {family!r} in {self.source} (no tests/models/{family}/); "
                    f"available: {', '.join(self.families()) or 'none'}"
                )
            found = sorted(directory.glob(pattern))
        else:
            globs = DIFFUSERS_PATTERNS.get(
                family, (f"tests/models/**/test_models_*{family}*.py", f"tests/pipelines/{family}/{pattern}")
            )
            found = sorted({p for g in globs for p in self.root.glob(g)})
            if pattern != "test_*.py":
                found = [p for p in found if p.match(pattern)]
        files = [str(p.relative_to(self.root)) for p in found if p.is_file()]
        if not files:
            raise SuiteError(f"--models: family {family!r} has no test files matching {pattern!r} in {self.source}")
        return files


def installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        raise SuiteError(f"--suite {name}: {name} is not installed; pip install {name}, or pass --suite-dir") from None


def from_checkout(name: str, path: str | os.PathLike) -> Suite:
    root = Path(path).expanduser().resolve()
    if not (root / "tests").is_dir():
        raise SuiteError(f"--suite-dir {path}: no tests/ directory there; pass the root of a {name} checkout")
    return Suite(name, root, installed_version(name), f"checkout {root}")


def cache_root() -> Path:
    from hf_tpu.plumbing import cache

    return cache.cache_root() / "ci" / "suites"


def fetch(name: str, version: str | None = None, *, log=print) -> Suite:  # noqa: ANN001 (a callable)
    """The test tree of ``name`` at ``version`` (the installed one by default), fetched once and cached."""
    if name not in SUITES:
        raise SuiteError(f"--suite {name!r}: not one of {', '.join(SUITES)}")
    version = version or installed_version(name)
    target = cache_root() / f"{name}-{version}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = target / "hf_tpu_source.json"
        if not marker.is_file():
            shutil.rmtree(target, ignore_errors=True)
            source = _fetch_git(name, version, target, log) or _fetch_sdist(name, version, target, log)
            marker.write_text(json.dumps({"source": source, "overlaid": []}))
        info = json.loads(marker.read_text())
        # refreshed every time: this checkout's testers, not the ones of the run that fetched the tree
        info["overlaid"] = _overlay(name, target, info["overlaid"])
        marker.write_text(json.dumps(info))
    return Suite(name, target, version, info["source"], info["overlaid"])


def _fetch_git(name: str, version: str, target: Path, log) -> str | None:  # noqa: ANN001
    tag = f"v{version}"
    url = f"https://github.com/huggingface/{name}"
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    cmd = ["git", "clone", "-q", "--depth", "1", "--branch", tag, "--filter=blob:none", url, str(target)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        log(f"git tag {tag} of {url}: {error}; falling back to the PyPI sdist")
        return None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["failed"])[-1]
        log(f"git tag {tag} of {url}: {reason}; falling back to the PyPI sdist")
        shutil.rmtree(target, ignore_errors=True)
        return None
    return f"git tag {tag} ({url})"


def _fetch_sdist(name: str, version: str, target: Path, log) -> str:  # noqa: ANN001
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            tmp,
            f"{name}=={version}",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SuiteError(
                f"fetching the {name}=={version} sdist from PyPI took over {FETCH_TIMEOUT_S} s; pass --suite-dir"
            ) from None
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            reason = (done.stderr.strip().splitlines() or ["no sdist"])[-1]
            raise SuiteError(
                f"cannot fetch {name}=={version}'s tests: GitHub unreachable and the PyPI sdist failed ({reason}); "
                "pass --suite-dir with a checkout"
            )
        with tarfile.open(archives[0]) as archive:
            members = []
            for member in archive.getmembers():
                parts = Path(member.name).parts
                if len(parts) > 1 and parts[1] in ("tests", "utils", "conftest.py") and member.isfile():
                    member.name = str(Path(*parts[1:]))
                    members.append(member)
            archive.extractall(target, members=members, filter="data")
    log(f"{name} {version}: tests from the PyPI sdist ({archives[0].name}), {len(members)} files")
    return f"PyPI sdist {archives[0].name}"


def _overlay(name: str, target: Path, ours: list[str]) -> list[str]:
    """Copy hf-tpu's testers and stand-ins into a fetched tree where it has no such file (or has ours)."""
    source = OVERLAYS / name
    added = []
    for path in sorted(source.rglob("*.py")):
        relative = path.relative_to(source)
        destination = target / relative
        if destination.exists() and str(relative) not in ours:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        added.append(str(relative))
    return added
