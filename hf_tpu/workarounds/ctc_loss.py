"""Gap ``ctc_loss``: CTC loss (forward and backward) runs on the host instead of aborting the process.

The CTC forward-backward recursion is sequential over time and small; the CPU kernels compute it,
and autograd (above the kernel) is unchanged. TorchTPU 0.2.0 also registers ``ctc_loss.Tensor`` itself, for
PrivateUse1 and AutogradPrivateUse1 (its own lowering, which never reaches ``_ctc_loss``; the real wheel showed
it): that overload goes back to torch's composite, which calls the ``_ctc_loss`` kernels below.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Kernels, on_cpu

_kernels = Kernels()
_composite = Kernels()
aten = torch.ops.aten


def _ctc_loss_composite(*args: Any) -> torch.Tensor:
    return aten.ctc_loss.Tensor.decompose(*args)


def apply() -> None:
    _kernels.register(
        {
            "_ctc_loss": on_cpu(aten._ctc_loss.default),
            "_ctc_loss.Tensor": on_cpu(aten._ctc_loss.Tensor),
            "_ctc_loss_backward": on_cpu(aten._ctc_loss_backward.default),
            "_ctc_loss_backward.Tensor": on_cpu(aten._ctc_loss_backward.Tensor),
        }
    )
    _composite.register({"ctc_loss.Tensor": _ctc_loss_composite}, dispatch_key="AutogradPrivateUse1")


def revert() -> None:
    _kernels.remove()
    _composite.remove()


WORKAROUNDS = (
    Fix.workaround(
        "ctc_loss_on_cpu", "ctc_loss", "aten::_ctc_loss, aten::_ctc_loss_backward (tpu kernels)", __doc__, apply, revert
    ),
)
