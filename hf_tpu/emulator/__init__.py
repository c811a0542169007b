"""The emulated TPU: a CPU-backed ``"tpu"`` device that behaves like TorchTPU.

Opt in with ``HF_TPU_EMULATE=1`` (then ``import torch`` is enough) or call
:func:`enable` before the first use of the device. A real TPU always wins.
It behaves like a chip in its numerics and known gaps too (profile ``torch_tpu``, the
default), or CPU-exact with no gaps (``HF_TPU_EMULATOR_PROFILE=ideal``).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from hf_tpu import settings
from hf_tpu.emulator import host_model
from hf_tpu.emulator._build import cache_dir
from hf_tpu.emulator.generations import DEFAULT_GENERATION, format_bytes, get_generation, parse_bytes
from hf_tpu.emulator.host_model import PROFILES, Host
from hf_tpu.emulator.tracking import Tracker, TransferEvent, counters, track

__all__ = [
    "PROFILES",
    "Host",
    "Tracker",
    "TransferEvent",
    "build",
    "cache_dir",
    "counters",
    "enable",
    "host",
    "is_enabled",
    "profile",
    "reproduced_gaps",
    "track",
]

# Held while the device is set up (never while torch is imported: see enable()). Not re-entrant: nothing called
# under it calls enable() again.
_lock = threading.Lock()
_enabled = False
_capacity = 0


def is_enabled() -> bool:
    """Whether this process runs the emulated TPU."""
    return _enabled


def host() -> Host | None:
    """This process's view of the emulated host (chips, visible chips, profile), once enabled."""
    return host_model.active()


def profile() -> str | None:
    """``"torch_tpu"`` or ``"ideal"`` once enabled, else None."""
    active = host_model.active()
    return active.profile if active is not None else None


def reproduced_gaps() -> frozenset[str]:
    """Names (as in ``hf_tpu.gaps``) of the TorchTPU gaps this emulated TPU reproduces."""
    from hf_tpu.emulator import gaps

    return gaps.reproduced()


def refused_operators() -> list[str]:
    """The aten operators this emulated TPU refuses as TorchTPU does (``op_coverage``: measured on the real wheel);
    none on the ideal profile."""
    from hf_tpu.emulator import gaps

    return gaps.refused()


def build(verbose: bool = False) -> str:
    """Compile the C++ core now (CI and images can call this ahead of time); returns the cache dir."""
    from hf_tpu.emulator import _build

    _build.load(verbose=verbose)
    return str(cache_dir())


def enable(
    generation: str | None = None,
    hbm: str | int | None = None,
    *,
    profile: str | None = None,
    quiet: bool = False,
) -> bool:
    """Set up the emulated ``"tpu"`` device in this process.

    Args:
        generation: TPU generation to emulate (``"v6e"`` by default, or ``HF_TPU_EMULATOR_GENERATION``).
        hbm: HBM capacity per chip, e.g. ``"64MiB"`` (default: the generation's, or ``HF_TPU_EMULATOR_HBM``).
        profile: ``"torch_tpu"`` (TPU numerics and TorchTPU's known gaps, the default) or ``"ideal"``
            (CPU-exact, no gaps); default ``HF_TPU_EMULATOR_PROFILE``.
        quiet: do not print the one-line announcement to stderr.

    The host (chips, visible chips, torchrun rank) comes from the environment: see ``host``.

    Returns:
        True if the emulator is active, False if a real TPU is present (the real TPU wins).

    Raises:
        RuntimeError: PrivateUse1 is already used by another backend, the core cannot be built, or the
            emulator is already set up with other settings.
    """
    global _enabled, _capacity
    # `import torch` runs the backend autoload, which calls enable() again when HF_TPU_EMULATE=1: torch is imported
    # before the lock is taken, so that inner call sets the device up (or fails) and this one then finds it done.
    import torch

    with _lock:
        if _enabled:
            _check_same_settings(generation, hbm, profile)
            return True
        from hf_tpu.plumbing.chips import real_tpu_present

        if real_tpu_present():
            warnings.warn(
                "hf-tpu: a real TPU is present, so the emulated TPU stays off (the real TPU wins).",
                stacklevel=2,
            )
            return False
        import importlib.util

        from hf_tpu import xla_cpu

        if xla_cpu.requested():
            raise RuntimeError(
                "hf-tpu: HF_TPU_XLA_CPU=1 and the emulated TPU ask for two different 'tpu' devices in one process "
                "(the real torch-tpu wheel on XLA:CPU, and the emulator); they cannot share it. Unset "
                "HF_TPU_XLA_CPU to emulate, or drop the emulator to run the real wheel."
            )
        if importlib.util.find_spec("torch_tpu") is not None:
            raise RuntimeError(
                "hf-tpu: cannot emulate a TPU here: torch-tpu is installed in this environment (with no TPU chip "
                "attached) and registers the 'tpu' device itself during `import torch`; the two cannot share a "
                "process. Use the emulator from an environment without torch-tpu (`python -m venv emu && emu/bin/pip "
                "install hf-tpu`), or run on a TPU VM. (torch-tpu without libtpu also ends `import torch` with "
                "exit status 1: `pip install libtpu` or uninstall torch-tpu.)"
            )
        taken = torch._C._get_privateuse1_backend_name()
        if taken != "privateuseone":
            raise RuntimeError(
                f"hf-tpu: cannot emulate a TPU: the PrivateUse1 device is already registered as {taken!r} by "
                "another backend in this process. Run the emulator in a process without that backend (or unset "
                "HF_TPU_EMULATE)."
            )
        gen = get_generation(generation or settings.text("HF_TPU_EMULATOR_GENERATION") or DEFAULT_GENERATION)
        hbm = hbm if hbm is not None else settings.text("HF_TPU_EMULATOR_HBM")
        capacity = parse_bytes(hbm) if hbm is not None else gen.hbm_bytes
        if hbm is not None and capacity > _host_ram():
            warnings.warn(
                f"hf-tpu: the emulated HBM ({format_bytes(capacity)} per chip, from hbm={hbm!r} / HF_TPU_EMULATOR_HBM) "
                f"exceeds this host's RAM ({format_bytes(_host_ram())}); allocations past the RAM fail as "
                "OutOfMemoryError naming the host. Choose an HBM size this machine can hold.",
                RuntimeWarning,
                stacklevel=2,
            )
        if profile is not None:
            if profile not in PROFILES:
                raise ValueError(
                    f"hf_tpu.emulator.enable(profile={profile!r}): use one of {', '.join(map(repr, PROFILES))} "
                    "('torch_tpu': TPU numerics and TorchTPU's known gaps, the default; 'ideal': CPU-exact)."
                )
            os.environ["HF_TPU_EMULATOR_PROFILE"] = profile
        # Every setting is checked before anything is registered: a bad one leaves torch untouched.
        chosen = host_model.profile_from_env()
        view = host_model.from_env(gen, chosen)
        from hf_tpu.emulator import gaps

        gaps.abort_mode()

        from hf_tpu.emulator._install import install

        install(gen, capacity, view)
        host_model.set_active(view)
        _enabled, _capacity = True, capacity
        if not quiet:
            sys.stderr.write(_announcement(view, capacity) + "\n")
    from hf_tpu.plumbing import device_ready as _hooks

    _hooks.device_ready()
    return True


def _host_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _announcement(view: Host, capacity: int) -> str:
    chips = f"{view.usable} chip" + ("s" if view.usable > 1 else "")
    if view.rank is not None:
        chips = f"chip {view.rank} of {view.chips} (torchrun rank)"
    elif view.usable != view.chips:
        chips += f" of {view.chips} (TPU_VISIBLE_DEVICES)"
    line = f"hf-tpu: emulated TPU {view.generation.key} (CPU-backed), {chips}, {format_bytes(capacity)} HBM"
    if view.usable > 1:
        line += " each"
    from hf_tpu.emulator import gaps

    if view.profile == "torch_tpu":
        count = len(gaps.reproduced() - set(gaps.not_torch_tpu()))
        return line + f", profile torch_tpu (TPU numerics, {count} known TorchTPU gaps)"
    return line + ", profile ideal (CPU-exact, no TorchTPU gaps)"


def _check_same_settings(generation: str | None, hbm: str | int | None, profile: str | None) -> None:
    """A second enable() with other settings would silently keep the first ones: say so instead."""
    active = host_model.active()
    assert active is not None
    asked = []
    if generation is not None and get_generation(generation).key != active.generation.key:
        asked.append(f"generation={generation!r} (active: {active.generation.key!r})")
    if hbm is not None and parse_bytes(hbm) != _capacity:
        asked.append(f"hbm={hbm!r} (active: {format_bytes(_capacity)})")
    if profile is not None and profile != active.profile:
        asked.append(f"profile={profile!r} (active: {active.profile!r})")
    if asked:
        raise RuntimeError(
            "hf-tpu: the emulated TPU is already set up in this process, so "
            + ", ".join(asked)
            + " cannot take effect. Set HF_TPU_EMULATOR_GENERATION / HF_TPU_EMULATOR_HBM / HF_TPU_EMULATOR_PROFILE "
            "before `import torch` (HF_TPU_EMULATE=1 sets the device up during the import), or call enable() first."
        )
