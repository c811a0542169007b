"""Bytes the collectives of a step send, over ICI (inside a slice) or DCN (across slices): what a layout costs.

    with hf_tpu.count_collectives() as counts:   # every rank enters (it gathers where each rank's chip is)
        train_step()
    print(counts.summary())

A collective whose group spans more than one slice crosses the data-centre network (DCN); one inside a slice
stays on the chips' ICI links. On TPU a slice is the ICI domain (a multi-host slice's hosts share it); on the
emulator each host of ``hf-tpu launch --emulate-hosts`` is a slice of its own unless ``--emulate-slices`` says
otherwise. The bytes are what each rank sends with ring algorithms (all-reduce 2(g-1)/g of the buffer,
all-gather (g-1) input shards, reduce-scatter and all-to-all (g-1)/g of the input, broadcast (g-1)/g, send all
of it); the counts cover ``torch.distributed``'s and its functional collectives' Python calls in eager mode
(tensor parallel, FSDP2 and replicate go through them; DDP's C++ reducer and compiled graphs do not).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from hf_tpu import settings

_lock = threading.Lock()  # guards _active while counting starts/stops; nothing under it imports or calls out
_active: list[CollectiveCounts] = []


@dataclass
class CollectiveCounts:
    """What one rank sent inside ``count_collectives()``."""

    slice_of_rank: list[int]
    bytes: dict[str, int] = field(default_factory=lambda: {"ici": 0, "dcn": 0})
    calls: dict[tuple[str, str, int], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    @property
    def ici_bytes(self) -> int:
        return self.bytes["ici"]

    @property
    def dcn_bytes(self) -> int:
        return self.bytes["dcn"]

    def add(self, op: str, ranks: list[int], sent: float) -> None:
        link = "dcn" if len({self.slice_of_rank[r] for r in ranks}) > 1 else "ici"
        self.bytes[link] += int(sent)
        entry = self.calls[(op, link, len(ranks))]
        entry[0] += 1
        entry[1] += int(sent)

    def summary(self) -> str:
        lines = [
            f"collectives: {self.ici_bytes:,} bytes over ICI, {self.dcn_bytes:,} bytes over DCN (sent by this rank)"
        ]
        for (op, link, size), (count, sent) in sorted(self.calls.items()):
            lines.append(f"  {op:<24} {link.upper():<4} group of {size:<3} {count:>5} calls {sent:>14,} bytes")
        return "\n".join(lines)


def local_slice() -> int:
    """This rank's slice: ``MEGASCALE_SLICE_ID`` on multislice jobs, else 0 (one slice)."""
    return int(settings.text("MEGASCALE_SLICE_ID") or 0)


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        local = getattr(x, "_local_tensor", x)
        return local.numel() * local.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(v) for v in x)
    return 0


def _dist_ranks(group: Any) -> list[int]:
    import torch.distributed as dist

    return list(dist.get_process_group_ranks(group or dist.group.WORLD))


def _funcol_ranks(group: Any) -> list[int]:
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    name = funcol._resolve_group_name(group)
    return list(dist.get_process_group_ranks(dist.distributed_c10d._resolve_process_group(name)))


# (module, function, index of the payload argument, its keyword, bytes sent for a payload of n in a group of g)
_RING: dict[str, Callable[[int, int], float]] = {
    "all_reduce": lambda n, g: 2 * (g - 1) / g * n,
    "all_gather": lambda n, g: (g - 1) * n,
    "reduce_scatter": lambda n, g: (g - 1) / g * n,
    "all_to_all": lambda n, g: (g - 1) / g * n,
    "broadcast": lambda n, g: (g - 1) / g * n,
    "send": lambda n, g: n,
}
_DIST = {  # torch.distributed: name -> (kind, the payload's parameter)
    "all_reduce": ("all_reduce", "tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "all_gather": ("all_gather", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "all_to_all_single": ("all_to_all", "input"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "broadcast": ("broadcast", "tensor"),
    "send": ("send", "tensor"),
    "isend": ("send", "tensor"),
}
_FUNCOL = {  # torch.distributed._functional_collectives: name -> (kind, the payload's parameter)
    "all_reduce": ("all_reduce", "self"),
    "all_gather_tensor": ("all_gather", "self"),
    "reduce_scatter_tensor": ("reduce_scatter", "self"),
    "all_to_all_single": ("all_to_all", "self"),
    "broadcast": ("broadcast", "self"),
}


def _counting(name: str, kind: str, payload: str, original: Callable, ranks_of: Callable) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if _active:
            try:
                bound = signature.bind(*args, **kwargs).arguments
                ranks = ranks_of(bound.get("group"))
            except Exception:  # noqa: BLE001  (a call torch itself will reject, or a group we cannot name)
                ranks = []
            if len(ranks) > 1:
                sent = _RING[kind](_nbytes(bound.get(payload)), len(ranks))
                for counts in _active:
                    counts.add(name, ranks, sent)
        return original(*args, **kwargs)

    collective.__wrapped__ = original  # type: ignore[attr-defined]
    return collective


@contextmanager
def count_collectives(group: Any = None) -> Iterator[CollectiveCounts]:
    """Count the bytes this rank's collectives send inside the block, by link (ICI or DCN).

    Every rank of ``group`` (default: the world) must enter: entering gathers each rank's slice."""
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as funcol

    if not dist.is_initialized():
        raise RuntimeError(
            "count_collectives() needs an initialised process group (torch.distributed.init_process_group)."
        )
    slices: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(slices, local_slice(), group=group)
    counts = CollectiveCounts([int(s) for s in slices])
    patched: list[tuple[Any, str, Any]] = []
    with _lock:
        if not _active:
            for module, table, ranks_of in ((dist, _DIST, _dist_ranks), (funcol, _FUNCOL, _funcol_ranks)):
                for name, (kind, payload) in table.items():
                    original = getattr(module, name, None)
                    if original is not None:
                        patched.append((module, name, original))
                        setattr(module, name, _counting(name, kind, payload, original, ranks_of))
        _active.append(counts)
    try:
        yield counts
    finally:
        with _lock:
            _active.remove(counts)
            for module, name, original in patched:
                setattr(module, name, original)
