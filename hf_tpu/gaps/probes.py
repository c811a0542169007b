"""One standalone probe per known gap: the smallest script that shows it, with nothing but torch.

A probe raises (or the process aborts) while its gap is present and exits 0 once it is fixed; it exits
3 when the machine cannot show the gap (too few chips). Each is what a TorchTPU bug report needs, so
none imports hf-tpu: on a TPU VM, TorchTPU loads with ``import torch``; on a laptop, run it with
``HF_TPU_EMULATE=1``.
"""

from __future__ import annotations

import textwrap

from hf_tpu.gaps import get, probe

NOT_APPLICABLE = 3

PREAMBLE = """\
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

DEVICE = "tpu"


def needs_chips(n):
    if torch.accelerator.device_count() < n:
        print(f"needs {n} chips, this machine has {torch.accelerator.device_count()}")
        sys.exit(3)

"""


def script(name: str) -> str:
    """The probe for gap ``name`` as a standalone script."""
    gap = get(name)
    header = textwrap.fill(f"Probe for '{name}': {gap.breaks}.", width=100, initial_indent="# ", subsequent_indent="# ")
    how = "# Exits 0 once the gap is fixed. On a TPU VM: python this.py; without a TPU: HF_TPU_EMULATE=1 python this.py"
    return f"{header}\n{how}\n{PREAMBLE}{probe(name).lstrip()}"
