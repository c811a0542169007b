"""``hf-tpu info``: which TPU this process uses, set up as the user's own process would set it up."""

from __future__ import annotations

import argparse
import importlib.util
import sys


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("info", help="print which TPU this process uses").set_defaults(command_function=command)


def command(args: argparse.Namespace) -> int:
    import torch  # noqa: F401  (sets the device up as the user's process would: real TPU, or the emulator)

    import hf_tpu
    from hf_tpu.plumbing.chips import real_tpu_present

    sys.stdout.write(f"hf-tpu {hf_tpu.__version__}: backend {hf_tpu.backend()}\n")
    if importlib.util.find_spec("torch_tpu") is not None and not real_tpu_present():
        sys.stdout.write(
            "note: torch-tpu is installed but no TPU chip is attached. torch-tpu registers the 'tpu' device during "
            "`import torch` (without libtpu it ends the import with exit status 1), so the emulated TPU cannot run in "
            "this environment: use one without torch-tpu for emulation.\n"
        )
    return 0
