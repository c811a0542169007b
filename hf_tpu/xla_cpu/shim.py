"""The PJRT shim between TorchTPU and XLA's CPU plugin: found, checked and built once, before torch is imported.

``pjrt_shim.c`` is compiled with the system C compiler into ``$HF_TPU_CACHE/xla_cpu/shim-<hash>/`` (the hash
covers the source, the flags and the machine), under the build lock the emulator's core uses, and recorded
with its size and hash: a later process checks the record and uses the library without a compiler; a truncated
or corrupt one is rebuilt. The CPU plugin's PJRT version is read once (``ctypes``: its ``GetPjrtApi`` table)
and kept beside the shim, keyed by the plugin file's path, size and time.

Nothing here imports torch: this runs from the start-up hook, before ``import torch`` loads TorchTPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hf_tpu import settings
from hf_tpu.plumbing.cache import BuildLock, cache_root, ensure_writable, file_digest

_SOURCE = Path(__file__).with_name("pjrt_shim.c")
_CFLAGS = ("-O2", "-shared", "-fPIC", "-fvisibility=hidden")
_LIBS = ("-ldl", "-lpthread")
_LIBRARY = "libhf_tpu_pjrt_shim.so"
_MANIFEST = "shim.json"
_WHAT = "the XLA:CPU PJRT shim"
# The PyPI package that carries XLA's CPU PJRT plugin (Apache-2.0), and the file in it.
PLUGIN_PACKAGE = "lammps_jax_pjrt_cpu"
PLUGIN_DISTRIBUTION = "lammps-jax-pjrt-cpu"
PLUGIN_FILE = "pjrt_c_api_cpu_plugin.so"
# The PJRT C API versions this was tested with: TorchTPU 0.2.0's framework side, and the CPU plugin of
# lammps-jax-pjrt-cpu 0.11.2. The shim itself needs major version 0 (its table layout); TorchTPU checks the rest.
FRAMEWORK_PJRT = {"0.2.0": (0, 116)}
TESTED_PLUGIN_PJRT = (0, 115)
SHIM_PJRT_MAJOR = 0


class XlaCpuSetupError(RuntimeError):
    """The real wheel cannot run on XLA:CPU here; the message says why and what to do."""


@dataclass(frozen=True)
class Plugin:
    """XLA's CPU PJRT plugin: where it is and the PJRT C API version its table reports."""

    path: str
    pjrt_version: tuple[int, int]

    @property
    def version_text(self) -> str:
        return f"{self.pjrt_version[0]}.{self.pjrt_version[1]}"


def _torch_tpu_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch-tpu")
    except metadata.PackageNotFoundError:
        return "not installed"


def plugin_path() -> str:
    """``HF_TPU_XLA_CPU_PLUGIN`` when set (any CPU PJRT plugin), else the one lammps-jax-pjrt-cpu installs."""
    explicit = settings.text("HF_TPU_XLA_CPU_PLUGIN") or ""
    if explicit:
        if not os.path.isfile(explicit):
            raise XlaCpuSetupError(
                f"hf-tpu: HF_TPU_XLA_CPU_PLUGIN={explicit!r} is not a file; point it at XLA's CPU PJRT plugin "
                f"({PLUGIN_FILE}) or unset it to use the one `pip install 'hf-tpu[xla-cpu]'` installs."
            )
        return explicit
    spec = importlib.util.find_spec(PLUGIN_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise XlaCpuSetupError(
            f"hf-tpu: HF_TPU_XLA_CPU=1 runs TorchTPU on XLA's CPU PJRT plugin, and {PLUGIN_DISTRIBUTION} (which "
            "carries it) is not installed: `pip install 'hf-tpu[xla-cpu]'`, or unset HF_TPU_XLA_CPU."
        )
    path = os.path.join(next(iter(spec.submodule_search_locations)), PLUGIN_FILE)
    if not os.path.isfile(path):
        raise XlaCpuSetupError(f"hf-tpu: {PLUGIN_DISTRIBUTION} is installed without {path}; reinstall it.")
    return path


def _read_pjrt_version(path: str) -> tuple[int, int]:
    """The (major, minor) PJRT C API version in the plugin's ``GetPjrtApi`` table (struct_size, priv, version)."""
    library = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
    get_api = library.GetPjrtApi
    get_api.restype = ctypes.c_void_p
    api = get_api()
    if not api:
        raise XlaCpuSetupError(f"hf-tpu: {path}'s GetPjrtApi returned no table; it is not a usable PJRT plugin.")
    major = ctypes.c_int.from_address(api + 2 * 8 + 2 * 8).value  # PJRT_Api_Version: struct_size, priv, major
    minor = ctypes.c_int.from_address(api + 2 * 8 + 2 * 8 + 4).value
    return major, minor


def plugin() -> Plugin:
    """The plugin to run on, its PJRT version checked against the shim's (cached per plugin file)."""
    path = plugin_path()
    stat = os.stat(path)
    key = f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    record = shim_dir() / "plugins.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        version = tuple(known[key])
    else:
        try:
            version = _read_pjrt_version(path)
        except OSError as err:
            raise XlaCpuSetupError(f"hf-tpu: cannot load XLA's CPU PJRT plugin {path}: {err}") from err
        try:
            ensure_writable(record.parent, _WHAT, XlaCpuSetupError)
            known[key] = list(version)
            tmp = record.with_suffix(f".{os.getpid()}")
            tmp.write_text(json.dumps(known, indent=1))
            tmp.replace(record)
        except (OSError, XlaCpuSetupError):
            pass  # only a cache: read the version again next time
    found = Plugin(path, (int(version[0]), int(version[1])))
    if found.pjrt_version[0] != SHIM_PJRT_MAJOR:
        framework = FRAMEWORK_PJRT.get(_torch_tpu_version())
        speaks = f"PJRT {framework[0]}.{framework[1]}" if framework else "an untested PJRT version"
        raise XlaCpuSetupError(
            f"hf-tpu: XLA's CPU PJRT plugin {path} speaks PJRT {found.version_text}, and torch-tpu "
            f"{_torch_tpu_version()} speaks {speaks}; hf-tpu's shim between them knows PJRT major version "
            f"{SHIM_PJRT_MAJOR} (tested: plugin {TESTED_PLUGIN_PJRT[0]}.{TESTED_PLUGIN_PJRT[1]}). Install the "
            f"tested plugin: `pip install '{PLUGIN_DISTRIBUTION}==0.11.2'` (or `pip install 'hf-tpu[xla-cpu]'`)."
        )
    return found


def _source_key() -> str:
    h = hashlib.sha256(f"{' '.join(_CFLAGS + _LIBS)}\n{platform.machine()}\n{sys.platform}\n".encode())
    h.update(_SOURCE.read_bytes())
    return h.hexdigest()


def shim_dir() -> Path:
    return cache_root() / "xla_cpu" / f"shim-{_source_key()[:16]}"


def _verified(directory: Path) -> bool:
    library = directory / _LIBRARY
    try:
        recorded = json.loads((directory / _MANIFEST).read_text())
        return library.stat().st_size == recorded["size"] and file_digest(library) == recorded["digest"]
    except (OSError, ValueError, KeyError):
        return False


def _compiler() -> str:
    for candidate in ((settings.text("CC") or "").split()[:1] or []) + ["cc", "gcc", "clang"]:
        if shutil.which(candidate):
            return candidate
    raise XlaCpuSetupError(
        "hf-tpu: HF_TPU_XLA_CPU=1 builds a small C library once (the PJRT shim between TorchTPU and XLA's CPU "
        "plugin), and no C compiler was found (looked for $CC, cc, gcc, clang). Install one (Debian/Ubuntu: "
        "`apt-get install gcc`) or set CC to its path."
    )


def ensure_built() -> Path:
    """The shim library: the verified cached build, else a fresh one (one builder at a time)."""
    directory = shim_dir()
    library = directory / _LIBRARY
    if _verified(directory):
        return library
    ensure_writable(directory, _WHAT, XlaCpuSetupError)
    compiler = _compiler()
    with BuildLock(directory, _WHAT, XlaCpuSetupError):
        if _verified(directory):  # another process built it while we waited
            return library
        tmp = directory / f"{_LIBRARY}.{os.getpid()}"
        cmd = [compiler, *_CFLAGS, "-o", str(tmp), str(_SOURCE), *_LIBS]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise XlaCpuSetupError(f"hf-tpu: building {_WHAT} timed out after 120 s: {' '.join(cmd)}") from None
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise XlaCpuSetupError(f"hf-tpu: building {_WHAT} failed: {' '.join(cmd)}\n{done.stderr.strip()}")
        tmp.replace(library)
        record = {"size": library.stat().st_size, "digest": file_digest(library), "source": _source_key()}
        manifest = directory / f"{_MANIFEST}.{os.getpid()}"
        manifest.write_text(json.dumps(record))
        manifest.replace(directory / _MANIFEST)
    return library


def counters(library: str) -> tuple[int, float]:
    """(XLA compilations, seconds spent compiling) in this process, as the loaded shim counted them."""
    shim = ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    compilations, nanoseconds = ctypes.c_uint64(), ctypes.c_uint64()
    shim.hf_tpu_shim_counters(ctypes.byref(compilations), ctypes.byref(nanoseconds))
    return compilations.value, nanoseconds.value / 1e9
