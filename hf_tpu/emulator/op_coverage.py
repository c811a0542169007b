"""The operators the real TorchTPU refuses, measured: the emulator's ``torch_tpu`` profile refuses them too.

``op_coverage/torch_tpu-<release>.json`` is written by ``scripts/op_coverage.py`` from PyTorch's OpInfo database
run on the real wheel (XLA:CPU) against CPU: per OpInfo and dtype, whether it agrees, is refused ("'aten::X' is
not implemented for TPU"), differs in value, errs or aborts. The refused operators are what the profile makes
raise TorchTPU's own error, so code that only works on the emulator fails on it as it would on the chip. The rest
of the table is data for docs/gaps.md and bug reports: the emulator does not reproduce a wrong value or an abort.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

TABLES = Path(__file__).with_name("op_coverage")


@functools.cache
def table(release: str) -> dict[str, Any]:
    """The coverage table measured for TorchTPU ``release`` (empty when none was measured)."""
    path = TABLES / f"torch_tpu-{release}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def refused_operators(release: str) -> list[str]:
    """Operators TorchTPU ``release`` has no kernel for, by name without overload ("aten::median"): the wheel names
    the overload it was asked for, which need not be the one the emulator's dispatcher sees."""
    names = {name.split(".")[0] for name in table(release).get("refused_operators", {})}
    return sorted(names)
