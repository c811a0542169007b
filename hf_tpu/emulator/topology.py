"""Where each rank's chip sits in the emulated job, and ``topology_aware_mesh`` laid out from it as TorchTPU does.

Every rank reports (slice, host, chip): the slice from ``MEGASCALE_SLICE_ID`` (set on multislice jobs, where
slices talk over DCN; absent on one slice, as TorchTPU's devices then carry no slice index), the host from
``HF_TPU_EMULATOR_HOST_INDEX`` (``hf-tpu launch --emulate-hosts``), the chip from the emulated host. Emulated
chips lie in a line in (slice, host, chip) order, so within a slice the mesh follows that order; across slices
the mesh is TorchTPU's hybrid one: ``mesh_shape / dcn_mesh_shape`` per slice (ICI), blocks over the slices.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hf_tpu import settings


@dataclass(frozen=True)
class Chip:
    """One rank's chip."""

    rank: int
    slice_index: int | None  # None: a single-slice job (no MegaScale client)
    host: int
    chip: int


def local_chip() -> tuple[int | None, int, int]:
    from hf_tpu.emulator import host_model

    slice_id = settings.text("MEGASCALE_SLICE_ID")
    active = host_model.active()
    visible = active.visible if active is not None else (0,)
    return (int(slice_id) if slice_id else None), int(settings.get("HF_TPU_EMULATOR_HOST_INDEX")), visible[0]


def gather_chips(group: object = None) -> list[Chip]:
    """Every rank's chip, indexed by global rank (a collective: every rank calls it)."""
    import torch.distributed as dist

    mine = local_chip()
    everyone: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    return [Chip(rank, *info) for rank, info in enumerate(everyone)]  # type: ignore[misc]


def infer_dcn_mesh_shape(mesh_shape: tuple[int, ...], num_slices: int) -> tuple[int, ...]:
    """Split across slices on the outermost axis longer than 1 (the least communication-hungry, as TorchTPU)."""
    axis = next((i for i, extent in enumerate(mesh_shape) if extent > 1), None)
    if axis is None:
        raise ValueError(
            f"Cannot spread mesh_shape={mesh_shape} over {num_slices} slices: every axis has extent 1. "
            "Pass dcn_mesh_shape to choose the split."
        )
    if mesh_shape[axis] % num_slices:
        raise ValueError(
            f"Cannot spread mesh_shape={mesh_shape} over {num_slices} slices: the outermost axis longer than 1 "
            f"(axis {axis}, extent {mesh_shape[axis]}) is not divisible by {num_slices}, and an inner axis would "
            "split shard groups across the slower inter-slice network. Reshape the mesh, or pass dcn_mesh_shape."
        )
    shape = [1] * len(mesh_shape)
    shape[axis] = num_slices
    return tuple(shape)


def _check(chips: list[Chip], mesh_shape: tuple[int, ...], dcn: tuple[int, ...]) -> None:
    if len(dcn) != len(mesh_shape):
        raise ValueError(
            f"mesh_shape and dcn_mesh_shape must have the same number of dimensions, got mesh_shape={mesh_shape} "
            f"and dcn_mesh_shape={dcn}."
        )
    counts = Counter(c.slice_index for c in chips)
    if math.prod(dcn) != len(counts):
        raise ValueError(
            f"dcn_mesh_shape={dcn} covers {math.prod(dcn)} slices, but the job has {len(counts)} "
            f"(slice indices {sorted(counts)})."
        )
    uneven = {axis: (m, d) for axis, (m, d) in enumerate(zip(mesh_shape, dcn, strict=True)) if m % d}
    if uneven:
        raise ValueError(
            f"dcn_mesh_shape={dcn} must divide mesh_shape={mesh_shape} elementwise (the per-slice shape is their "
            f"quotient); these axes do not, as axis: (mesh, dcn): {uneven}."
        )
    if math.prod(mesh_shape) != len(chips):
        raise ValueError(
            f"mesh_shape={mesh_shape} has {math.prod(mesh_shape)} elements but the job has {len(chips)} devices "
            f"across {len(counts)} slices: mesh_shape describes the whole mesh."
        )
    ragged = {s: n for s, n in counts.items() if n != len(chips) // len(counts)}
    if ragged:
        raise ValueError(
            f"Every slice must contribute {len(chips) // len(counts)} devices, but these do not: {ragged}."
        )


def rank_layout(
    chips: list[Chip], mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int] | None = None
) -> torch.Tensor:
    """Global ranks laid out as ``mesh_shape`` (int64), the DCN axes across slices."""
    shape = tuple(int(s) for s in mesh_shape)
    reporting = sum(c.slice_index is not None for c in chips)
    if reporting not in (0, len(chips)):
        raise RuntimeError(
            f"{reporting} of {len(chips)} ranks report a slice index (MEGASCALE_SLICE_ID): every rank of a "
            "multislice job needs the same MegaScale settings."
        )
    ordered = sorted(chips, key=lambda c: (c.slice_index or 0, c.host, c.chip))
    num_slices = len({c.slice_index for c in chips}) if reporting else 1
    dcn = tuple(int(s) for s in dcn_mesh_shape) if dcn_mesh_shape is not None else None
    if num_slices == 1 and (dcn is None or math.prod(dcn) == 1):
        if math.prod(shape) != len(chips):
            raise ValueError(
                f"mesh_shape {shape} has {math.prod(shape)} devices but the world has {len(chips)} processes."
            )
        return torch.tensor([c.rank for c in ordered], dtype=torch.int64).reshape(shape)
    if not reporting:
        raise RuntimeError(
            f"A multi-slice layout was requested (dcn_mesh_shape={dcn}), but the devices report no slice index: "
            "this job runs on one slice (set MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID, or `hf-tpu launch "
            "--emulate-hosts H` whose hosts are slices of their own)."
        )
    dcn = dcn if dcn is not None else infer_dcn_mesh_shape(shape, num_slices)
    _check(chips, shape, dcn)
    ici = tuple(m // d for m, d in zip(shape, dcn, strict=True))
    per_slice = torch.tensor([c.rank for c in ordered], dtype=torch.int64).reshape(*dcn, *ici)
    n = len(shape)
    interleaved = [axis for pair in zip(range(n), range(n, 2 * n), strict=True) for axis in pair]
    return per_slice.permute(interleaved).reshape(shape)
