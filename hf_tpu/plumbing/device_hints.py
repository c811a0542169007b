"""Errors that say what to do when the ``"tpu"`` device is used the wrong way, or is not there.

torch parses device strings in C++, so ``"TPU"`` or ``"tpu:-1"`` keep torch's own message. Two cases hf-tpu
can answer: a torch_xla habit (``device="xla"``) without torch_xla installed, and an emulated TPU whose
set-up failed inside ``import torch`` (the failure would otherwise surface later as torch's list of
device types).
"""

from __future__ import annotations

import importlib.util
import types
from typing import Any, NoReturn

_libraries: list[Any] = []  # kept alive: a dropped Library deregisters its kernels


def _fallback(dispatch_key: str, message: str) -> None:
    import torch

    def refuse(op: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{message} (while running {op._schema.name})")

    library = torch.library.Library("_", "IMPL")  # noqa: TOR901
    library.fallback(refuse, dispatch_key)
    _libraries.append(library)


def install_xla_hint() -> None:
    """``device="xla"`` without torch_xla: the error names TorchTPU's device instead of a missing kernel."""
    if importlib.util.find_spec("torch_xla") is not None:
        return
    _fallback(
        "XLA",
        "hf-tpu: device 'xla' is torch_xla's, which is not installed; with TorchTPU the TPU is device 'tpu': "
        "use torch.device('tpu') or .to('tpu') (torch_xla's xm.xla_device() becomes torch.device('tpu'))",
    )


def install_setup_failure(err: BaseException, what: str = "the emulated TPU", switch: str = "HF_TPU_EMULATE") -> None:
    """The device failed to set up during ``import torch``: make ``"tpu"`` a device whose every use says why."""
    import torch

    if torch._C._get_privateuse1_backend_name() != "privateuseone" or importlib.util.find_spec("torch_tpu"):
        return  # the device is (or will be) torch-tpu's, whose kernels hold PrivateUse1: leave it alone
    message = (
        f"hf-tpu: {what} could not be set up during `import torch`: {err} Fix that and start a new process (or "
        f"unset {switch})"
    )
    torch.utils.rename_privateuse1_backend("tpu")
    torch._register_device_module("tpu", _Unavailable("torch.tpu", message))
    _fallback("PrivateUse1", message)


class _Unavailable(types.ModuleType):
    """``torch.tpu`` of a device that failed to set up: every use repeats why."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name, message)
        self._message = message

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise RuntimeError(self.__dict__["_message"])
