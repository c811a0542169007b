"""``hf-tpu build``: compile the emulated TPU's C++ core now (else it is built on first use)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("build", help="build the emulated TPU's C++ core now").set_defaults(command_function=command)


def command(args: argparse.Namespace) -> int:
    from hf_tpu import emulator
    from hf_tpu.emulator._build import CoreBuildError

    try:
        sys.stdout.write(f"hf-tpu: core built in {emulator.build()}\n")
    except CoreBuildError as err:
        sys.stderr.write(f"{err}\n")
        return 1
    return 0
