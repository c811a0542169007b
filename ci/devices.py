"""The two sides of a run: ``tpu`` (a real TPU when this VM has one, else the emulated TPU) and ``cpu``.

The harness itself never imports torch: on a TPU VM that would take the chips the tests need.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass

from hf_tpu.plumbing.backend import needs_emulator

DEVICES = ("tpu", "cpu")
# variables a run sets; anything already set in the caller's environment is dropped for the child
OWNED = (
    "TRANSFORMERS_TEST_DEVICE",
    "DIFFUSERS_TEST_DEVICE",
    "HF_TPU_EMULATE",
    "HF_TPU_EMULATOR_PROFILE",
    "HF_TPU_EMULATOR_HOST",
    "HF_TPU_WORKAROUNDS",
    "HF_TPU_CI_PRECISION",
    "HF_TPU_CI_RECORD_OPS",
    "RUN_SLOW",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
)


@dataclass(frozen=True)
class Side:
    """How the tests of one side run: the variables that pick the device, and what to call it."""

    device: str  # "tpu" or "cpu"
    emulated: bool
    profile: str = "torch_tpu"  # the emulator's profile (emulated tpu only)
    workarounds: bool = True
    precision: str | None = None  # float32 matmul precision forced for every test (triage)

    def env(self, run_slow: bool) -> dict[str, str]:
        env = {"TRANSFORMERS_TEST_DEVICE": self.device, "DIFFUSERS_TEST_DEVICE": self.device}
        if self.device == "tpu" and self.emulated:
            env["HF_TPU_EMULATE"] = "1"
            env["HF_TPU_EMULATOR_PROFILE"] = self.profile
        if self.device == "cpu":
            # the baseline is plain PyTorch on CPU: no TorchTPU (on a TPU VM it would look for the chips the tpu
            # side holds), no emulator, no hf-tpu patches
            env["HF_TPU_EMULATE"] = "0"
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        if not self.workarounds:
            env["HF_TPU_WORKAROUNDS"] = "0"
        if self.precision:
            env["HF_TPU_CI_PRECISION"] = self.precision
        if run_slow:
            env["RUN_SLOW"] = "1"
        return env

    def label(self) -> str:
        if self.device == "cpu":
            return "CPU"
        what = f"emulated TPU (profile {self.profile})" if self.emulated else "TPU"
        return what + ("" if self.workarounds else ", hf-tpu workarounds off")


def tpu_side(workarounds: bool = True) -> Side:
    """The real TPU when there is one (it always wins), the real wheel on XLA:CPU when asked, else the emulator's
    faithful profile."""
    return Side("tpu", emulated=needs_emulator(), workarounds=workarounds)


def child_env(side: Side, run_slow: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OWNED}
    env.update(side.env(run_slow))
    env.setdefault("TRANSFORMERS_IS_CI", "yes")  # as upstream's runner
    env.setdefault("NO_COLOR", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_repo_root(), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def versions() -> dict[str, str]:
    """What a TorchTPU bug report needs, read without importing anything."""
    out = {}
    for name in ("torch", "torch_tpu", "libtpu", "jax", "transformers", "diffusers", "accelerate", "hf-tpu"):
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
