"""``hf-tpu``: the command line, one module per command (``register`` adds its arguments, ``command`` runs it).

hf-tpu launch -n 4 train.py --lr 1e-4   # torchrun --standalone, one process per chip
hf-tpu launch -n 8 --nnodes 4 train.py   # on every host of a 4-host slice: torchrun's c10d rendezvous
hf-tpu launch --emulate-hosts 2 -n 2 train.py   # 2 emulated hosts x 2 chips on this machine
hf-tpu gaps                              # probe TorchTPU's known gaps here, and what hf-tpu closes
hf-tpu gaps --show cholesky              # a gap's standalone repro, for a TorchTPU bug report
hf-tpu gaps --fixes                      # every patch and workaround hf-tpu applies, and why
hf-tpu build                             # compile the emulator's C++ core ahead of time
hf-tpu env [--json]                      # versions, chips, backend, settings, fixes: paste into a bug report
hf-tpu info                              # which TPU this process would use
hf-tpu check MODEL [--run]               # whether a model fits a TPU slice, its plan, speed bounds and risks
"""

from __future__ import annotations

import argparse
import importlib

# the order ``hf-tpu --help`` lists them in
COMMANDS = ("launch", "gaps", "build", "env", "info", "check")


def parser() -> argparse.ArgumentParser:
    """``hf-tpu``'s parser: each command module registers its own sub-command."""
    import hf_tpu

    top = argparse.ArgumentParser(
        prog="hf-tpu", description="Hugging Face on TPUs: launch, probe gaps, check a model, report."
    )
    top.add_argument("--version", action="version", version=f"hf-tpu {hf_tpu.__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"hf_tpu.commands.{name}").register(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.command_function(args)
