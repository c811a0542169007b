"""``python -m torch.tpu.distributed`` on the emulated TPU: the launch environment as shell assignments.

As TorchTPU's: sets the launch variables (``set_tpu_launch_env``), then prints ``TORCH_TPU_TOPOLOGY``,
``TORCH_TPU_SLICEBUILDER_ADDRESSES``, ``TORCH_TPU_XPROF_SESSION_ID``, ``WORLD_SIZE`` (the host's chips, or one
per slice-builder address), ``NODE_RANK`` and, when set, ``NNODES``, ``MASTER_ADDR``, ``MASTER_PORT``, so that
a launch script can ``eval "$(python -m torch.tpu.distributed)"``.
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> None:
    torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=torch.accelerator.device_count())
    addresses = os.environ.get("TORCH_TPU_SLICEBUILDER_ADDRESSES", "")
    lines = [
        f'TORCH_TPU_TOPOLOGY="{os.environ.get("TORCH_TPU_TOPOLOGY", "")}"',
        f'TORCH_TPU_SLICEBUILDER_ADDRESSES="{addresses}"',
        f'TORCH_TPU_XPROF_SESSION_ID="{os.environ.get("TORCH_TPU_XPROF_SESSION_ID", "")}"',
        f"WORLD_SIZE={len(addresses.split(',')) if addresses else torch.accelerator.device_count()}",
        f'NODE_RANK="{os.environ.get("NODE_RANK", "0")}"',
    ]
    lines += [f'{name}="{os.environ[name]}"' for name in ("NNODES", "MASTER_ADDR", "MASTER_PORT") if name in os.environ]
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
