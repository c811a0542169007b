"""The emulated host: how many chips it has, which of them this process sees, and its profile.

What a process sees follows TorchTPU 0.2.0 (its ``_internal/utils/hardware.py`` and
``device/_device_module.py``) and Hugging Face's TPU CI, which runs its multi-device tests with
8 chips in one process:

- a plain process on an N-chip host sees every chip: ``device_count() == N``, tensors on
  ``tpu:0``..``tpu:N-1``, bound to ``tpu:0`` (``set_device_index`` to another chip raises);
- a torchrun rank (``LOCAL_RANK`` set) sees only its own chip, as ``tpu:0``, and
  ``device_count() == 1`` (transformers' ``_bind_local_device``: "torch_tpu gives each process a
  single chip, always at index 0");
- ``TPU_VISIBLE_DEVICES`` / ``TPU_VISIBLE_CHIPS`` restrict the chips a process opens, but
  ``device_count()`` keeps reporting the whole host (gap ``visible_devices``);
- a chip is held by the first process that uses it; another process that opens it aborts
  (gap ``device_sharing``). Processes share a host when they share ``HF_TPU_EMULATOR_HOST``:
  the first emulating process of a process tree makes one up and its children inherit it.

The profile (``HF_TPU_EMULATOR_PROFILE``) is ``torch_tpu`` (TPU numerics and every known gap,
the default) or ``ideal`` (CPU-exact numerics, no gaps: for debugging a model without TPU quirks).
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from dataclasses import dataclass, field

from hf_tpu import settings
from hf_tpu.emulator.generations import GENERATIONS, Generation

PROFILES = ("torch_tpu", "ideal")
DEFAULT_PROFILE = "torch_tpu"
# Chips per host of each generation's largest single-host slice (Cloud TPU docs).
CHIPS_PER_HOST = {"v4": 4, "v5e": 8, "v5p": 4, "v6e": 8, "v7": 4}
_SLICE = re.compile(r"^(v[0-9]+[a-z]*)-([0-9]+)$")


@dataclass(frozen=True)
class Host:
    """One process's view of the emulated host."""

    generation: Generation
    chips: int  # chips on the host
    visible: tuple[int, ...]  # host chip ids this process uses, in local index order (tpu:0, tpu:1, ...)
    reported: int  # what device_count() answers
    rank: int | None  # LOCAL_RANK for a torchrun rank, else None
    host_id: str
    profile: str
    lock_dir: str | None = field(default=None)  # None: chips are not locked (ideal profile)

    @property
    def usable(self) -> int:
        return len(self.visible)

    def lock_paths(self) -> list[str]:
        if self.lock_dir is None:
            return ["" for _ in self.visible]
        return [os.path.join(self.lock_dir, f"chip-{chip}.lock") for chip in self.visible]

    def labels(self) -> list[str]:
        return [f"chip {chip} of emulated host {self.host_id!r}" for chip in self.visible]


def profile_from_env() -> str:
    return settings.get("HF_TPU_EMULATOR_PROFILE")


def _int_env(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be a whole number.") from None
    if number < 1:
        raise ValueError(f"{name}={value!r} must be at least 1.")
    return number


def parse_slice(text: str) -> tuple[str, int]:
    """``"v6e-8"`` -> ("v6e", 8): a single-host slice (multi-host slices need several processes)."""
    match = _SLICE.match(text.strip().lower())
    if match is None or match.group(1) not in GENERATIONS:
        raise ValueError(
            f"HF_TPU_EMULATOR_SLICE={text!r} is not a slice name; write it like 'v6e-8' (generation-chips), "
            f"with a generation among {', '.join(GENERATIONS)}."
        )
    key, chips = match.group(1), int(match.group(2))
    per_host = CHIPS_PER_HOST[key]
    if chips > per_host:
        raise ValueError(
            f"HF_TPU_EMULATOR_SLICE={text!r} spans {chips // per_host} hosts ({per_host} chips per {key} host); a "
            f"process tree emulates one host: run `hf-tpu launch --emulate-hosts {chips // per_host} -n {per_host} "
            f"--emulate-slices 1 SCRIPT` for the whole slice, or use {key}-{per_host} or fewer."
        )
    return key, chips


def _visible_chips(chips: int) -> tuple[int, ...]:
    for name in ("TPU_VISIBLE_CHIPS", "TPU_VISIBLE_DEVICES"):
        value = settings.text(name) or ""
        if not value:
            continue
        try:
            ids = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"{name}={value!r} must be a comma-separated list of chip ids, e.g. '0,1'.") from None
        bad = [i for i in ids if not 0 <= i < chips]
        if bad or not ids or len(set(ids)) != len(ids):
            raise ValueError(f"{name}={value!r}: this emulated host has chips 0..{chips - 1}; each at most once.")
        return ids
    return tuple(range(chips))


def host_id() -> str:
    """This process tree's emulated host, made up (and exported to children) on first use."""
    value = settings.text("HF_TPU_EMULATOR_HOST")
    if not value:
        value = f"{socket.gethostname()}-{os.getpid()}"
        os.environ["HF_TPU_EMULATOR_HOST"] = value
    return value


def lock_dir(host: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", host)
    path = os.path.join(tempfile.gettempdir(), "hf-tpu-emulator", safe)
    os.makedirs(path, exist_ok=True)
    return path


def from_env(generation: Generation, profile: str) -> Host:
    """The host this process sees, from ``HF_TPU_EMULATOR_CHIPS`` / ``HF_TPU_EMULATOR_SLICE`` and the launch variables."""
    chips: int | None = None
    slice_name = settings.text("HF_TPU_EMULATOR_SLICE")
    if slice_name:
        _, chips = parse_slice(slice_name)
    if settings.is_set("HF_TPU_EMULATOR_CHIPS"):
        chips = _int_env("HF_TPU_EMULATOR_CHIPS", settings.get("HF_TPU_EMULATOR_CHIPS"))
    faithful = profile == "torch_tpu"
    ident = host_id()
    locks = lock_dir(ident) if faithful else None
    local_rank, local_ranks = settings.text("LOCAL_RANK"), settings.text("LOCAL_WORLD_SIZE")
    if local_rank is not None and local_ranks is not None:
        rank = _int_env("LOCAL_RANK + 1", str(int(local_rank) + 1)) - 1
        ranks = _int_env("LOCAL_WORLD_SIZE", local_ranks)
        if chips is None:
            chips = ranks  # the launch sizes the host
        if rank >= chips:
            raise ValueError(
                f"torchrun started {ranks} ranks on this host, but the emulated host has {chips} chip(s) "
                f"(HF_TPU_EMULATOR_CHIPS / HF_TPU_EMULATOR_SLICE): rank {rank} has no chip. Launch at most {chips} ranks."
            )
        return Host(generation, chips, (rank,), 1, rank, ident, profile, locks)
    chips = chips or 1
    visible = _visible_chips(chips)
    reported = chips if faithful else len(visible)
    return Host(generation, chips, visible, reported, None, ident, profile, locks)


_active: Host | None = None  # this process's view, once the emulator is enabled


def active() -> Host | None:
    """This process's view of the emulated host, once :func:`hf_tpu.emulator.enable` has set the device up."""
    return _active


def set_active(view: Host) -> None:
    global _active
    _active = view
