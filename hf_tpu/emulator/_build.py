"""Build and load the emulator's C++ core, once per environment.

The core is compiled on first use with ``torch.utils.cpp_extension`` (ninja) and cached under
``$HF_TPU_CACHE/emulator/`` (default ``~/.cache/hf-tpu``), in a directory keyed by the torch version,
the Python version and the environment itself (its prefix and torch's location), so two virtualenvs never
share, or rebuild, each other's core. A build records the library's size and hash and the sources it
came from (``core.json``); a later process checks them and loads the library directly, without
cpp_extension or a compiler. A library that fails the check (truncated, corrupt) is rebuilt.

Builds take an exclusive ``flock`` on ``build.lock``: the kernel releases it when the builder dies, so
a killed build never blocks the next one (it also clears the baton file cpp_extension leaves behind).
A process waiting for another's build says so and gives up after ``HF_TPU_BUILD_TIMEOUT`` seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

from hf_tpu import settings
from hf_tpu.plumbing.cache import BuildLock, cache_root, ensure_writable, file_digest

_CSRC = Path(__file__).with_name("csrc")
# Laid out by interface (csrc/core.h has the map): runtime/ (what torch asks of a device), aten/ (how ops run),
# tpu/ (what makes it TorchTPU), and the Python module.
_SOURCE_DIRS = ("runtime", "aten", "tpu")


def _sources() -> list[Path]:
    return sorted(p for d in _SOURCE_DIRS for p in (_CSRC / d).glob("*.cpp")) + [_CSRC / "bindings.cpp"]


def _headers() -> list[Path]:
    return sorted(_CSRC.rglob("*.h"))


_CFLAGS = ("-O2", "-fvisibility=hidden")
_MANIFEST = "core.json"
_WHAT = "the emulated TPU core"
_module: ModuleType | None = None


class CoreBuildError(RuntimeError):
    """The emulator's core could not be built or loaded; the message says why and what to do."""


class _BuildLock(BuildLock):
    """The build lock of this environment's core (``build.lock`` in its cache directory)."""

    def __init__(self, build_dir: Path) -> None:
        super().__init__(build_dir, _WHAT, CoreBuildError)


def _prepare(build_dir: Path) -> None:
    ensure_writable(build_dir, _WHAT, CoreBuildError)


def environment_key() -> str:
    """torch and Python versions plus a hash of this environment (its prefix and torch's location)."""
    import torch

    where = f"{os.path.realpath(sys.prefix)}\n{os.path.realpath(os.path.dirname(torch.__file__))}"
    digest = hashlib.sha256(where.encode()).hexdigest()[:12]
    return f"torch-{torch.__version__.replace('+', '_')}-{sys.implementation.cache_tag}-{digest}"


def cache_dir() -> Path:
    """Where this environment's compiled core lives."""
    return cache_root() / "emulator" / environment_key()


def _extension_name() -> str:
    import torch

    version = torch.__version__.split("+")[0].replace(".", "_")
    return f"hf_tpu_emulator_core_{version}"


def _sources_digest() -> str:
    import torch

    h = hashlib.sha256(f"{torch.__version__}\n{' '.join(_CFLAGS)}\n".encode())
    for path in (*_sources(), *_headers()):
        h.update(str(path.relative_to(_CSRC)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _library(build_dir: Path) -> Path:
    return build_dir / f"{_extension_name()}.so"


def _verified(build_dir: Path) -> tuple[bool, str]:
    """Whether the cached library is the one the manifest describes, built from these sources."""
    manifest, library = build_dir / _MANIFEST, _library(build_dir)
    if not library.exists():
        return False, "no library"
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False, "no manifest"
    if recorded.get("sources") != _sources_digest():
        return False, "sources changed"
    if library.stat().st_size != recorded.get("size") or file_digest(library) != recorded.get("digest"):
        return False, f"{library} does not match its recorded size and hash (truncated or corrupt)"
    return True, ""


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(_extension_name(), library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_compiler() -> None:
    cxx = settings.text("CXX") or sysconfig.get_config_var("CXX") or "c++"
    if shutil.which(cxx.split()[0]) is None and shutil.which("c++") is None:
        raise CoreBuildError(
            "hf-tpu: the emulated TPU needs a C++ compiler to build its core once, and none was found "
            f"(looked for {cxx!r} and 'c++'). Install one (Debian/Ubuntu: `apt-get install g++`; "
            "macOS: `xcode-select --install`) or set CXX to its path."
        )
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401  (the PyPI package puts the binary on PATH via its bin dir)
        except ImportError as err:
            raise CoreBuildError("hf-tpu: building the emulated TPU core needs ninja: `pip install ninja`.") from err


def _build(build_dir: Path, verbose: bool) -> ModuleType:
    _check_compiler()
    from torch.utils import cpp_extension

    with _BuildLock(build_dir):
        ok, why = _verified(build_dir)  # another process may have built it while we waited
        if ok:
            return _import(_library(build_dir))
        baton = build_dir / "lock"  # cpp_extension's own baton: whoever left it died (we hold the flock)
        baton.unlink(missing_ok=True)
        if why not in ("no library", "sources changed", "no manifest"):
            sys.stderr.write(f"hf-tpu: {why}; rebuilding it.\n")
        _library(build_dir).unlink(missing_ok=True)  # so ninja relinks rather than trusting a bad file
        sys.stderr.write("hf-tpu: building the emulated TPU core for this environment (once, about a minute)...\n")
        start = time.perf_counter()
        module = cpp_extension.load(
            name=_extension_name(),
            sources=[str(path) for path in _sources()],
            extra_cflags=list(_CFLAGS),
            extra_include_paths=[str(_CSRC)],
            build_directory=str(build_dir),
            verbose=verbose,
        )
        library = _library(build_dir)
        record = {"sources": _sources_digest(), "size": library.stat().st_size, "digest": file_digest(library)}
        tmp = build_dir / f"{_MANIFEST}.{os.getpid()}"
        tmp.write_text(json.dumps(record))
        tmp.replace(build_dir / _MANIFEST)
        sys.stderr.write(f"hf-tpu: built in {time.perf_counter() - start:.0f} s ({build_dir})\n")
        return module


def load(verbose: bool = False) -> ModuleType:
    """Return the compiled core: the verified cached library, else a fresh build."""
    global _module
    if _module is not None:
        return _module
    if "torch_tpu" in sys.modules:  # its kernels hold PrivateUse1: a second backend there aborts the process
        raise CoreBuildError(
            "hf-tpu: the emulated TPU's core cannot load in this process: torch-tpu is imported here and holds the "
            "'tpu' device (PrivateUse1). Use the emulator from a process (and an environment) without torch-tpu."
        )
    build_dir = cache_dir()
    if _verified(build_dir)[0]:
        try:
            _module = _import(_library(build_dir))
            return _module
        except ImportError as err:  # e.g. torch reinstalled in place with another ABI: rebuild
            sys.stderr.write(f"hf-tpu: the cached core {_library(build_dir)} does not load ({err}); rebuilding it.\n")
            (build_dir / _MANIFEST).unlink(missing_ok=True)
    _prepare(build_dir)
    _module = _build(build_dir, verbose)
    return _module
