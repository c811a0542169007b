"""Build and load the emulator's C++ core, once per torch version.

The core is compiled on first use with ``torch.utils.cpp_extension`` (ninja) and cached
under the user cache dir, keyed by the torch and Python versions, so a torch upgrade
rebuilds it and an edit of the sources rebuilds only the changed files.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = (
    "allocator.cpp",
    "runtime.cpp",
    "gaps.cpp",
    "native_ops.cpp",
    "fallback.cpp",
    "numerics.cpp",
    "bindings.cpp",
)
_module: ModuleType | None = None


def cache_dir() -> Path:
    """Where the compiled core lives: ``$HF_TPU_CACHE`` or ``~/.cache/hf-tpu``, per torch version."""
    import torch

    root = os.environ.get("HF_TPU_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hf-tpu"
    )
    tag = f"torch-{torch.__version__.replace('+', '_')}-{sys.implementation.cache_tag}"
    return Path(root) / "emulator" / tag


def _extension_name() -> str:
    import torch

    version = torch.__version__.split("+")[0].replace(".", "_")
    return f"hf_tpu_emulator_core_{version}"


def _check_compiler() -> None:
    cxx = os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++"
    if shutil.which(cxx.split()[0]) is None and shutil.which("c++") is None:
        raise RuntimeError(
            "hf-tpu: the emulated TPU needs a C++ compiler to build its core once, and none was found "
            f"(looked for {cxx!r} and 'c++'). Install one (Debian/Ubuntu: `apt-get install g++`; "
            "macOS: `xcode-select --install`) or set CXX to its path."
        )
    if shutil.which("ninja") is None:
        try:
            import ninja  # noqa: F401  (the PyPI package puts the binary on PATH via its bin dir)
        except ImportError as err:
            raise RuntimeError("hf-tpu: building the emulated TPU core needs ninja: `pip install ninja`.") from err


def load(verbose: bool = False) -> ModuleType:
    """Return the compiled core, building it first if this torch version has no build yet."""
    global _module
    if _module is not None:
        return _module
    from torch.utils import cpp_extension

    _check_compiler()
    build_dir = cache_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    name = _extension_name()
    fresh = not any(build_dir.glob(f"{name}*.so"))
    if fresh:
        sys.stderr.write(
            "hf-tpu: building the emulated TPU core for this torch version (first use only, about a minute)..." + "\n"
        )
    start = time.perf_counter()
    _module = cpp_extension.load(
        name=name,
        sources=[str(_CSRC / s) for s in _SOURCES],
        extra_cflags=["-O2", "-fvisibility=hidden"],
        build_directory=str(build_dir),
        verbose=verbose,
    )
    if fresh:
        sys.stderr.write(f"hf-tpu: built in {time.perf_counter() - start:.0f} s ({build_dir})" + "\n")
    return _module
