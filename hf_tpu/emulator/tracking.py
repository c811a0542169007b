"""Who moved data between host and device, and who made the host wait.

The core counts every host->device copy, device->host copy and sync (``.item()``,
``.cpu()``, ``.tolist()``, ``print``) per process. Inside ``track()`` each event also
records the first frame outside torch and the emulator, i.e. the line to look at.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from hf_tpu.emulator import _build
from hf_tpu.emulator.generations import format_bytes

_KINDS = ("host_to_device", "device_to_host", "sync")
# Frames in these trees are not "the user's": the standard library, installed packages
# (torch, transformers...) and the emulator itself. The first frame outside them is reported.
_SKIP_DIRS = tuple(
    sorted(
        {
            os.path.join(p, "")
            for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("purelib"), sysconfig.get_path("platlib"))
        }
        | {os.path.join(os.path.dirname(__file__), "")}
    )
)


@dataclass(frozen=True)
class TransferEvent:
    """One host<->device copy or sync, with the frame that caused it."""

    kind: str  # "host_to_device" | "device_to_host" | "sync"
    nbytes: int
    what: str  # "copy to tpu", "copy to cpu", "item"
    frame: str  # "path/to/file.py:12 in fn"


def _user_frame() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS) and not filename.startswith("<frozen"):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


@dataclass
class Tracker:
    """Events recorded inside one ``track()`` block."""

    events: list[TransferEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _record(self, kind: int, nbytes: int, what: str) -> None:
        event = TransferEvent(_KINDS[kind], nbytes, what, _user_frame())
        with self._lock:
            self.events.append(event)
            if kind == 1:  # a device->host copy makes the host wait for the device: also a sync
                self.events.append(TransferEvent("sync", nbytes, what, event.frame))

    def _of(self, kind: str) -> list[TransferEvent]:
        return [e for e in self.events if e.kind == kind]

    @property
    def host_to_device(self) -> list[TransferEvent]:
        return self._of("host_to_device")

    @property
    def device_to_host(self) -> list[TransferEvent]:
        return self._of("device_to_host")

    @property
    def syncs(self) -> list[TransferEvent]:
        return self._of("sync")

    def report(self) -> str:
        """A table: per kind, count and bytes; then each (kind, frame) with its count, most frequent first."""
        lines = [f"{'event':<16}{'count':>8}{'bytes':>14}"]
        for kind in _KINDS:
            evs = self._of(kind)
            lines.append(f"{kind:<16}{len(evs):>8}{format_bytes(sum(e.nbytes for e in evs)):>14}")
        by_site = Counter((e.kind, e.what, e.frame) for e in self.events)
        if by_site:
            lines.append("")
            lines.append(f"{'count':>6}  {'event':<16}{'op':<13}where")
            for (kind, what, frame), n in by_site.most_common():
                lines.append(f"{n:>6}  {kind:<16}{what:<13}{frame}")
        return "\n".join(lines)


_active: list[Tracker] = []
_active_lock = threading.Lock()  # guards the active trackers; nothing under it imports or calls out


def _dispatch(kind: int, nbytes: int, what: str) -> None:
    for tracker in list(_active):
        tracker._record(kind, nbytes, what)


@contextlib.contextmanager
def track() -> Iterator[Tracker]:
    """Record every transfer and sync made inside the block, with the frame that made it."""
    core = _build.load()
    tracker = Tracker()
    with _active_lock:
        _active.append(tracker)
        core.set_tracker(_dispatch)
    try:
        yield tracker
    finally:
        with _active_lock:
            _active.remove(tracker)
            if not _active:
                core.set_tracker(None)


def counters() -> dict[str, tuple[int, int]]:
    """Per-process totals since start: ``{"host_to_device": (count, bytes), "device_to_host": ..., "syncs": ...}``."""
    return dict(_build.load().counters())
