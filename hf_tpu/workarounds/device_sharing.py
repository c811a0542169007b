"""Gap ``device_sharing``: name the process that holds the TPU before TorchTPU aborts on it.

A chip can be open in one process only; a second process that opens it aborts with nothing to say
who holds it. On a TPU VM each chip is a VFIO device (``/dev/vfio/<group>``), so the holder is the
process with that file open. At set-up hf-tpu warns with its pid and command line. (The emulated
TPU names the holder itself in the error it raises.)
"""

from __future__ import annotations

import os
import warnings

from hf_tpu.fixes import Fix
from hf_tpu.plumbing.chips import tpu_vfio_paths


def holders(paths: list[str]) -> dict[str, list[tuple[int, str]]]:
    """For each path, the other processes that have it open: ``[(pid, command line), ...]``."""
    wanted = {os.path.realpath(p): p for p in paths}
    found: dict[str, list[tuple[int, str]]] = {p: [] for p in paths}
    me = os.getpid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = "?"
                found[wanted[target]].append((int(entry), cmd))
    return found


def apply() -> None:
    for path, procs in holders(tpu_vfio_paths()).items():
        for pid, cmd in procs:
            warnings.warn(
                f"hf-tpu: the TPU chip {path} is held by process {pid} ({cmd[:120]}): TorchTPU aborts this process "
                "when it opens the chip (gap 'device_sharing'). Stop that process, or run this work inside it.",
                UserWarning,
                stacklevel=2,
            )


def revert() -> None:
    """Nothing to undo: the check only warns."""


WORKAROUNDS = (
    Fix.workaround(
        "device_sharing_names_the_holder", "device_sharing", "a warning at set-up (real TPU)", __doc__, apply, revert
    ),
)
