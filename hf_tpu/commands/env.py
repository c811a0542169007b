"""``hf-tpu env``: what a bug report needs, in one block: versions, chips, the backend in use, settings, fixes.

It sets the device up the way the user's own script would (``import torch``: a real TPU, or the emulator
when ``HF_TPU_EMULATE=1``), so what it prints is what their process sees.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from hf_tpu import settings

PACKAGES = (
    "hf-tpu",
    "torch",
    "torch-tpu",
    "libtpu",
    "jax",
    "jaxlib",
    "tokamax",
    "transformers",
    "diffusers",
    "accelerate",
    "kernels",
    "safetensors",
    "huggingface_hub",
)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _chips() -> list[dict[str, str]]:
    from hf_tpu.plumbing.chips import GENERATIONS, tpu_chips

    return [
        {
            "vfio": path,
            "pci_id": pci_id,
            "generation": next((g.key for g in GENERATIONS.values() if g.pci_id == pci_id), "unknown"),
        }
        for path, pci_id in tpu_chips()
    ]


def _backend() -> dict[str, Any]:
    import torch

    from hf_tpu import emulator
    from hf_tpu.plumbing.backend import backend

    info: dict[str, Any] = {"backend": backend()}
    if torch.accelerator.is_available():
        accelerator = torch.accelerator.current_accelerator()
        info["accelerator"] = str(accelerator)
        info["device_count"] = torch.accelerator.device_count()
        free, total = torch.accelerator.get_memory_info()
        info["hbm_per_chip_bytes"] = total
    from hf_tpu import xla_cpu

    if xla_cpu.active():
        info["xla_cpu"] = xla_cpu.describe()
    if emulator.is_enabled():
        host = emulator.host()
        assert host is not None
        info["emulator"] = {
            "generation": host.generation.key,
            "profile": host.profile,
            "chips": host.chips,
            "usable_chips": host.usable,
            "reproduced_gaps": sorted(emulator.reproduced_gaps()),
            "refused_operators": emulator.refused_operators(),
            "precision": torch.get_float32_matmul_precision(),
        }
    return info


def _core_cache() -> dict[str, str]:
    from hf_tpu.emulator import _build

    build_dir = _build.cache_dir()
    ok, why = _build._verified(build_dir)
    return {"dir": str(build_dir), "state": "built, verified" if ok else f"not usable yet: {why}"}


def collect() -> dict[str, Any]:
    """Everything ``hf-tpu env`` prints, as a dict (``--json``)."""
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in PACKAGES},
        "chips_on_pci_bus": _chips(),
        "settings": settings.current(),
    }
    try:
        report["device"] = _backend()
    except Exception as err:  # noqa: BLE001  (a broken set-up is exactly what a report must show)
        report["device"] = {"error": f"{type(err).__name__}: {err}"}
    try:
        report["emulator_core_cache"] = _core_cache()
    except Exception as err:  # noqa: BLE001
        report["emulator_core_cache"] = {"error": f"{type(err).__name__}: {err}"}
    from hf_tpu import fixes

    report["compile_caches"] = compile_caches()
    report["fixes"] = [{k: row[k] for k in ("name", "kind", "gap", "state", "off")} for row in fixes.report()]
    backend = report["device"].get("backend")
    if _version("torch-tpu") != "not installed" and not report["chips_on_pci_bus"] and backend != "xla_cpu":
        report["note"] = (
            "torch-tpu is installed but no TPU chip is attached: torch-tpu registers the 'tpu' device during "
            "`import torch` (without libtpu it ends the import with exit status 1), so the emulated TPU cannot run "
            "in this environment; use one without torch-tpu for emulation, or run the real wheel on XLA:CPU here "
            "(HF_TPU_XLA_CPU=1, with `pip install 'hf-tpu[xla-cpu]'`)."
        )
    return report


def format_text(report: dict[str, Any]) -> str:
    lines = [f"hf-tpu environment (python {report['python']}, {report['platform']})", "", "packages:"]
    lines += [f"  {name:<16} {version}" for name, version in report["packages"].items()]
    chips = report["chips_on_pci_bus"]
    lines += ["", f"TPU chips on the PCI bus: {len(chips)}"]
    lines += [f"  {c.get('vfio')}  {c.get('pci_id', '?')}  TPU {c.get('generation', '?')}" for c in chips]
    device = report["device"]
    lines += ["", "device:"] + [f"  {k}: {v}" for k, v in device.items() if k != "emulator"]
    for key, value in device.get("xla_cpu", {}).items():
        lines.append(f"  xla_cpu {key}: {value}")
    for key, value in device.get("emulator", {}).items():
        shown = ", ".join(value) if isinstance(value, list) else value
        if key == "refused_operators":  # a long list: its count and where it comes from
            shown = f"{len(value)}, as the real wheel refuses them (measured: hf_tpu/emulator/op_coverage/; --json lists them)"
        lines.append(f"  emulator {key}: {shown}")
    cache = report["emulator_core_cache"]
    lines += ["", "emulator core cache:"] + [f"  {k}: {v}" for k, v in cache.items()]
    lines += ["", "compile caches (a second process compiles nothing they hold):"]
    lines += [f"  {k}: {v}" for k, v in report["compile_caches"].items()]
    lines += ["", "settings (set here; every variable hf-tpu reads: python -m hf_tpu.settings):"]
    lines += [f"  {k}={v}  ({_about(k)})" for k, v in report["settings"].items()] or ["  (none set)"]
    lines += ["", "fixes (patches, workarounds and TPU defaults):"]
    for f in report["fixes"]:
        off = f"  (off: {f['off']})" if f["off"] else ""
        lines.append(f"  {f['name']:<42} {f['kind']:<13} {f['gap']:<30} {f['state']}{off}")
    if "note" in report:
        lines += ["", f"note: {report['note']}"]
    return "\n".join(lines)


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def compile_caches() -> dict[str, str]:
    """The compile caches of this process, for ``hf-tpu env``: where, how large, how to clear."""
    from hf_tpu.emulator.generations import format_bytes
    from hf_tpu.plumbing.compile_cache import (
        INDUCTOR,
        SWITCH,
        TIER2,
        TIER3,
        emulator_executables_dir,
        enabled,
    )

    rows: dict[str, str] = {"switch": f"{SWITCH}={'1' if enabled() else '0'}"}
    places = {
        "torch_tpu tier 3": settings.text(TIER3),
        "torch_tpu tier 2": settings.text(TIER2) and f"/dev/shm/torch_tpu_cache/{settings.text(TIER2)}",
        "inductor (emulator graphs)": settings.text(INDUCTOR),
        "emulator eager executables": str(emulator_executables_dir()) if emulator_executables_dir().is_dir() else None,
    }
    for label, place in places.items():
        if not place:
            continue
        path = Path(place)
        size = format_bytes(_size(path)) if path.is_dir() else "empty"
        rows[label] = f"{place} ({size}; clear: rm -rf {place})"
    if len(rows) == 1:
        rows["caches"] = "none set in this process (they are set when the device is)"
    return rows


def register(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="versions, chips, backend, settings and fixes, for a bug report")
    env.add_argument("--json", action="store_true", help="print the report as JSON")
    env.set_defaults(command_function=command)


def command(args: argparse.Namespace) -> int:
    report = collect()
    sys.stdout.write((json.dumps(report, indent=2) if args.json else format_text(report)) + "\n")
    return 0


def _about(name: str) -> str:
    """What the settings table says of a variable (its help, or why hf-tpu reads another's), else "not read"."""
    if name in settings.BY_NAME:
        return settings.BY_NAME[name].help
    return settings.OTHERS.get(name, "not read by hf-tpu")
