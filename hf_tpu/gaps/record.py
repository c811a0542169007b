"""The record of one known gap: what breaks, the evidence, how the emulator reproduces it, what closes it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gap:
    """One known gap of the TPU backend (or of a library's TPU support)."""

    name: str
    breaks: str  # what a user meets
    evidence: str  # versions known to have it, and how we know
    emulator: str  # how the emulated TPU reproduces it
    workaround: str | None  # the hf-tpu workaround (a name in `hf-tpu env`), or None
    advice: str = ""  # what to do when no workaround can close it
    fixed_in: str | None = None
    needs_chips: int = 1  # chips the probe needs to show the gap
    component: str = "torch_tpu"
    # a regex a failing test's error matches when this gap is the cause (``python -m ci`` triage);
    # the emulator's own gap errors name the gap ("known gap 'NAME'") and need none
    signature: str = ""
    # what a model's forward calls when it meets this gap (``hf-tpu check`` risks): torch functions by name,
    # aten ops as "aten.<op>" ("aten.index.bool_mask": aten.index with a boolean mask)
    ops: tuple[str, ...] = ()
    # a race: a probe that does not see it has not shown it fixed ("not seen"), so no measurement turns its
    # workaround off
    intermittent: bool = False
    # why the real wheel on XLA:CPU cannot show the gap (a Pallas kernel, one device, ...); "" when it can
    hidden_on_xla_cpu: str = ""
    # where the emulator reproduces it: "core" (the C++ core: the ``Gap`` enumerator of the same name in
    # emulator/csrc/tpu/gaps.h), "python" (hf_tpu/emulator, on the torch_tpu profile), "every profile" (not the
    # backend's choice: present on the ideal profile too), or "no" (its ``emulator`` field says what it does instead)
    emulation: str = "core"

    @property
    def emulated(self) -> bool:
        return self.emulation != "no"
