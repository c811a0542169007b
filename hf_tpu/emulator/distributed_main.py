"""``python -m torch.tpu.distributed`` on the emulated TPU: the launch environment as shell assignments.

As TorchTPU's: sets the launch variables (``set_tpu_launch_env``), then prints ``TORCH_TPU_TOPOLOGY``,
``TORCH_TPU_SLICEBUILDER_ADDRESSES``, ``TORCH_TPU_XPROF_SESSION_ID``, ``WORLD_SIZE`` (the host's chips, or one
per slice-builder address), ``NODE_RANK`` and, when set, ``NNODES``, ``MASTER_ADDR``, ``MASTER_PORT``, so that
a launch script can ``eval "$(python -m torch.tpu.distributed)"``.
"""

from __future__ import annotations

import sys

import torch

from hf_tpu import settings


def main() -> None:
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=torch.accelerator.device_count())
    addresses = settings.text("TORCH_TPU_SLICEBUILDER_ADDRESSES") or ""
    lines = [
        f'TORCH_TPU_TOPOLOGY="{settings.text("TORCH_TPU_TOPOLOGY") or ""}"',
        f'TORCH_TPU_SLICEBUILDER_ADDRESSES="{addresses}"',
        f'TORCH_TPU_XPROF_SESSION_ID="{settings.text("TORCH_TPU_XPROF_SESSION_ID") or ""}"',
        f"WORLD_SIZE={len(addresses.split(',')) if addresses else torch.accelerator.device_count()}",
        f'NODE_RANK="{settings.text("NODE_RANK") or "0"}"',
    ]
    set_by_launch = {name: settings.text(name) for name in ("NNODES", "MASTER_ADDR", "MASTER_PORT")}
    lines += [f'{name}="{value}"' for name, value in set_by_launch.items() if value is not None]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
