"""Every environment variable hf-tpu reads, declared once: name, kind (its parser), default and help.

hf-tpu's own variables (``HF_TPU_*``) are :data:`SETTINGS`; the variables of others that hf-tpu reads (TorchTPU's,
torchrun's, the TPU VM's) are :data:`OTHERS`, each with why. Code reads them through :func:`get` and :func:`text`
only, so this file is the whole list; ``hf-tpu env`` shows them and ``docs/settings.md`` is generated from them
(``python -m hf_tpu.settings``, checked by the tests).

A value hf-tpu cannot use is an error naming the variable, the value and what it accepts: a typo in
``HF_TPU_STRICT_RECOMPILE=2`` must not quietly mean "off".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class EnvError(ValueError):
    """An hf-tpu environment variable holds a value hf-tpu cannot use."""


@dataclass(frozen=True)
class Setting:
    """One variable: ``kind`` is its parser (flag: yes/no; choice: one of ``choices``; seconds: a positive number;
    text: the string as given, checked where it is used, e.g. a chip generation or a path)."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    error: str = ""  # what a bad value's error says after "NAME='value'" (choice); default: the choices
    group: str = "general"


SETTINGS: tuple[Setting, ...] = (
    # ---- which device
    Setting("HF_TPU_EMULATE", "flag", False, "set up the emulated TPU during `import torch` (a real TPU always wins, "
            "with a warning)", group="device"),
    Setting("HF_TPU_XLA_CPU", "flag", False, "run the real torch-tpu wheel on XLA's CPU plugin (its own environment: "
            "`pip install 'hf-tpu[xla-cpu]'`)", group="device"),
    Setting("HF_TPU_XLA_CPU_PLUGIN", "text", None, "the XLA:CPU PJRT plugin (.so) to load (default: the one jax ships)",
            group="device"),
    # ---- the emulated TPU
    Setting("HF_TPU_EMULATOR_PROFILE", "choice", "torch_tpu", "`torch_tpu`: TPU numerics and TorchTPU's gaps; "
            "`ideal`: CPU-exact, no gaps", choices=("torch_tpu", "ideal"),
            error="is not a profile; use 'torch_tpu' (TPU numerics and TorchTPU's known gaps, the default) or 'ideal' "
            "(CPU-exact, no gaps).", group="emulator"),
    Setting("HF_TPU_EMULATOR_GENERATION", "text", "v6e", "`v4`, `v5e`, `v5p`, `v6e`, `v7`: name and HBM per chip",
            group="emulator"),
    Setting("HF_TPU_EMULATOR_HBM", "text", None, "HBM capacity per chip, e.g. `64MiB`, `8GiB` (default: the "
            "generation's)", group="emulator"),
    Setting("HF_TPU_EMULATOR_CHIPS", "text", None, "chips on the emulated host (default 1, or torchrun's ranks)",
            group="emulator"),
    Setting("HF_TPU_EMULATOR_SLICE", "text", None, "chips on the emulated host as a single-host slice name, e.g. "
            "`v6e-8`", group="emulator"),
    Setting("HF_TPU_EMULATOR_HOST", "text", None, "which emulated host the process is on (made up and inherited by "
            "children; processes of one host share its chips)", group="emulator"),
    Setting("HF_TPU_EMULATOR_HOST_INDEX", "text", "0", "the emulated host's index in its slice (set by `hf-tpu launch "
            "--emulate-hosts`)", group="emulator"),
    Setting("HF_TPU_EMULATOR_HOSTS", "text", None, "emulated hosts in the job (set by `hf-tpu launch "
            "--emulate-hosts`)", group="emulator"),
    Setting("HF_TPU_EMULATOR_GAPS", "choice", "raise", "where TorchTPU aborts the process: `raise` a RuntimeError "
            "saying so, or `abort` like the chip", choices=("raise", "abort"),
            error="is not one of 'raise' (the default: where TorchTPU aborts the process, the emulator raises a "
            "RuntimeError saying so) or 'abort' (abort like the chip, for harness tests).", group="emulator"),
    Setting("HF_TPU_COMPILE_FALLBACK", "choice", None, "`aot_eager`: compile graphs to op-by-op execution instead "
            "of Inductor C++ (automatic without a C++ compiler)", choices=("aot_eager",), group="emulator"),
    # ---- gaps and fixes
    Setting("HF_TPU_WORKAROUNDS", "flag", True, "`0`: no workarounds for the backend's gaps (real and emulated TPU)",
            group="fixes"),
    Setting("HF_TPU_GAPS_FILE", "text", None, "where `hf-tpu gaps` keeps its measurement (default "
            "`$HF_TPU_CACHE/gaps/<backend>.json`)", group="fixes"),
    Setting("HF_TPU_GENERATE_BUCKETS", "flag", True, "`0`: generate() keeps upstream's shapes (no static cache at "
            "power-of-two prompt lengths)", group="fixes"),
    Setting("HF_TPU_TRAIN_BUCKETS", "flag", True, "`0`: Trainer batches keep their lengths (no padding to "
            "power-of-two buckets)", group="fixes"),
    Setting("HF_TPU_STRICT_RECOMPILE", "flag", False, "any recompile after a function's first compile raises",
            group="fixes"),
    Setting("HF_TPU_RAGGED_DOT_IMPLEMENTATION", "text", None, "the ragged-dot kernel's implementation (default: "
            "tokamax's Pallas kernel on a chip, the reference elsewhere)", group="fixes"),
    # ---- caches, launch
    Setting("HF_TPU_CACHE", "text", None, "hf-tpu's cache: the emulator's core, the XLA:CPU shim, compile caches, "
            "gap measurements (default `$XDG_CACHE_HOME/hf-tpu`, else `~/.cache/hf-tpu`)", group="caches"),
    Setting("HF_TPU_COMPILE_CACHE", "flag", True, "`0`: hf-tpu leaves every compile-cache setting to you",
            group="caches"),
    Setting("HF_TPU_BUILD_TIMEOUT", "seconds", 1800.0, "seconds to wait for another process's build of the core or "
            "the shim", group="caches"),
    Setting("HF_TPU_JOIN_TIMEOUT", "seconds", 300.0, "seconds ranks wait for every peer to join a process group",
            group="launch"),
    Setting("HF_TPU_RDZV_IS_HOST", "flag", False, "this emulated host keeps the rendezvous store (set by `hf-tpu "
            "launch --emulate-hosts` on host 0)", group="launch"),
)  # fmt: skip

# Variables of others that hf-tpu reads, and why.
OTHERS: dict[str, str] = {
    "TPU_VISIBLE_DEVICES": "TorchTPU: the chips a process opens (the emulator honours it; hf-tpu warns on a chip)",
    "TPU_VISIBLE_CHIPS": "TorchTPU: as TPU_VISIBLE_DEVICES",
    "TPU_LIBRARY_PATH": "TorchTPU: its runtime library (hf-tpu points it at the XLA:CPU shim)",
    "TPU_WORKER_HOSTNAMES": "Cloud TPU VM: the hosts of the slice (`hf-tpu launch`, the emulator's launch environment)",
    "TORCH_TPU_TOPOLOGY": "TorchTPU: the slice's topology (launch environment)",
    "TORCH_TPU_SLICEBUILDER_ADDRESSES": "TorchTPU: the slice builder's addresses (launch environment)",
    "TORCH_TPU_XPROF_SESSION_ID": "TorchTPU: the profiling session of a multi-host job (launch environment)",
    "TORCH_TPU_BASE_PORT": "TorchTPU: the first slice-builder port (launch environment)",
    "TORCH_TPU_DEVICES_PER_HOST": "TorchTPU: chips per host (launch environment)",
    "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS": "TorchTPU: keep its deprecated device APIs (the emulator follows it)",
    "TORCH_TPU_DEFER_AND_FUSE": "TorchTPU: defer and fuse eager ops (the emulator reports it)",
    "TORCH_TPU_LAUNCH_BLOCKING": "TorchTPU: run eager ops synchronously (the emulator reports it)",
    "TORCH_TPU_TIER2_COMPILATION_CACHE": "TorchTPU: its host-memory compile cache (hf-tpu names it when unset)",
    "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "TorchTPU: its persistent compile cache (hf-tpu sets it when unset)",
    "TORCHINDUCTOR_CACHE_DIR": "torch: Inductor's cache (hf-tpu puts the emulator's under HF_TPU_CACHE when unset)",
    "MEGASCALE_SLICE_ID": "TorchTPU: this host's slice in a multi-slice job",
    "LOCAL_RANK": "torchrun: the rank on this host (a rank sees only its own chip)",
    "LOCAL_WORLD_SIZE": "torchrun: ranks on this host (the emulated host's chips)",
    "WORLD_SIZE": "torchrun: ranks in the job",
    "NODE_RANK": "torchrun: this host's index",
    "NNODES": "torchrun: hosts in the job",
    "MASTER_ADDR": "torchrun: the rendezvous host",
    "MASTER_PORT": "torchrun: the rendezvous port",
    "JOB_COMPLETION_INDEX": "Kubernetes indexed jobs: this host's index",
    "XDG_CACHE_HOME": "the user's cache directory (HF_TPU_CACHE's default)",
    "CXX": "the C++ compiler for the emulator's core",
    "CC": "the C compiler for the XLA:CPU shim",
}

BY_NAME: dict[str, Setting] = {setting.name: setting for setting in SETTINGS}


def _declared(name: str) -> Setting:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in hf_tpu.settings.SETTINGS") from None


def text(name: str) -> str | None:
    """The variable as set, stripped (None when unset), for a variable declared here (ours or another's)."""
    if name not in BY_NAME and name not in OTHERS:
        raise KeyError(f"{name} is not declared in hf_tpu.settings (SETTINGS or OTHERS)")
    value = os.environ.get(name)
    return None if value is None else value.strip()


def is_set(name: str) -> bool:
    """Whether a declared variable is set to something (an empty value counts as unset)."""
    return bool(text(name))


def get(name: str) -> Any:
    """An hf-tpu variable, parsed by its kind (unset or empty: its default)."""
    setting = _declared(name)
    raw = os.environ.get(name, "")
    value = raw.strip()
    if setting.kind == "flag":
        if not value:
            return setting.default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise EnvError(
            f"{name}={raw!r} is not a yes/no value: use 1 (or true/yes/on) or 0 (false/no/off), or unset it."
        )
    if setting.kind == "choice":
        if not value:
            return setting.default
        if value.lower() not in setting.choices:
            error = (
                setting.error or f"is not one of {', '.join(map(repr, setting.choices))}; set one of them or unset it."
            )
            raise EnvError(f"{name}={raw!r} {error}")
        return value.lower()
    if setting.kind == "seconds":
        if not value:
            return setting.default
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number > 0 or number == float("inf"):
            raise EnvError(
                f"{name}={raw!r}: give a number of seconds greater than 0 (default {setting.default:g}); a wait "
                "without end would hang on a peer that never comes."
            )
        return number
    return value or setting.default


# a bug report also shows the TPU-related variables hf-tpu does not read (PJRT_DEVICE, TPU_* of the VM, ...)
_REPORTED_PREFIXES = ("HF_TPU_", "TPU_", "TORCH_TPU_", "TORCH_DEVICE_BACKEND_AUTOLOAD", "PJRT_",
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")  # fmt: skip


def current() -> dict[str, str]:
    """The variables a bug report shows, as set in this process (``hf-tpu env``): every declared one that is set, and
    the TPU-related others."""
    declared = {s.name for s in SETTINGS} | set(OTHERS)
    return {k: v for k, v in sorted(os.environ.items()) if k in declared or k.startswith(_REPORTED_PREFIXES)}


def markdown() -> str:
    """The settings page (docs/settings.md), from the tables."""
    lines = [
        "# Settings",
        "",
        "Generated from `hf_tpu/settings.py` (`python -m hf_tpu.settings > docs/settings.md`); the tests check it is",
        "current. Every variable hf-tpu reads is declared there once; a value it cannot use is an error naming the",
        "variable, the value and what it accepts. Flags take 1/true/yes/on or 0/false/no/off.",
    ]
    groups = dict.fromkeys(s.group for s in SETTINGS)
    for group in groups:
        lines += ["", f"## {group}", "", "| variable | kind | default | what it does |", "|---|---|---|---|"]
        for s in SETTINGS:
            if s.group != group:
                continue
            kind = f"{s.kind}: {' / '.join(s.choices)}" if s.choices else s.kind
            default = "unset" if s.default is None else f"`{s.default if s.kind != 'flag' else int(s.default)}`"
            lines.append(f"| `{s.name}` | {kind} | {default} | {s.help} |")
    lines += ["", "## read from others", "", "| variable | why hf-tpu reads it |", "|---|---|"]
    lines += [f"| `{name}` | {why} |" for name, why in OTHERS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown())
