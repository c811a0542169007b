"""TorchTPU's known gaps: one module per gap in ``hf_tpu/gaps/known/`` (its ``GAP`` record and its ``PROBE``
script), found here; the gap's workaround, if any, is ``hf_tpu/workarounds/<name>.py``.

Evidence: [ci] Hugging Face's TPU CI on 8x v6e with torch_tpu 0.1.2.dev20261005 (transformers'
``utils/tpu_ci/``: failure counts and standalone probes); [wheel] the torch-tpu 0.2.0 wheel (its
Python sources and the kernel names in its ``libpywrap_2_13_0_common.so``); [run] the 0.2.0 wheel
itself, run on XLA:CPU (``HF_TPU_XLA_CPU=1``); [reading] inferred, not seen on a chip. ``fixed_in`` is the first TorchTPU release known to fix a gap (None: no fix known,
so the gap is assumed present in every release); the emulator's ``torch_tpu`` profile is TorchTPU 0.2.0, so it
reproduces only the gaps 0.2.0 has.

``hf-tpu gaps`` runs the probes (``probes.py`` adds their preamble), one subprocess each, and records what
it measured; workarounds are installed from that measurement when there is one for this backend,
else from this table.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from hf_tpu.gaps import known
from hf_tpu.gaps.record import Gap

__all__ = ["BY_NAME", "GAPS", "Gap", "get", "probe"]


def _modules() -> dict[str, ModuleType]:
    found = {}
    for info in sorted(pkgutil.iter_modules(known.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{known.__name__}.{info.name}")
        if module.GAP.name != info.name:
            raise RuntimeError(f"{module.__name__} records gap {module.GAP.name!r}: a gap's module is named after it")
        found[info.name] = module
    return found


_MODULES = _modules()
GAPS: tuple[Gap, ...] = tuple(module.GAP for module in _MODULES.values())
BY_NAME: dict[str, Gap] = {gap.name: gap for gap in GAPS}


def get(name: str) -> Gap:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown gap {name!r}; known: {', '.join(BY_NAME)}") from None


def probe(name: str) -> str:
    """The body of gap ``name``'s probe (``probes.script`` makes it a standalone script)."""
    get(name)
    return _MODULES[name].PROBE


def markdown() -> str:
    """The gap table of docs/gaps.md, from the records (``python -m hf_tpu.gaps``)."""
    rows = ["| gap | what breaks | the emulator | hf-tpu's workaround | fixed in |", "|---|---|---|---|---|"]
    for gap in GAPS:
        reproduced = {"core": "its core", "python": "yes", "every profile": "every profile", "no": "no"}
        closes = f"`{gap.workaround}`" if gap.workaround else f"none: {gap.advice}" if gap.advice else "none"
        owner = "" if gap.component == "torch_tpu" else f" ({gap.component})"
        rows.append(
            f"| `{gap.name}`{owner} | {gap.breaks} | {reproduced[gap.emulation]} | {closes} | {gap.fixed_in or '-'} |"
        )
    return "\n".join(rows) + "\n"
