"""Gap ``ctc_loss``: CTC loss (forward and backward) runs on the host instead of aborting the process.

The CTC forward-backward recursion is sequential over time and small; the CPU kernels compute it,
and autograd (above the kernel) is unchanged.
"""

from __future__ import annotations

import torch

from ._tools import Kernels, on_cpu

_kernels = Kernels()
aten = torch.ops.aten


def apply() -> None:
    _kernels.register(
        {
            "_ctc_loss": on_cpu(aten._ctc_loss.default),
            "_ctc_loss.Tensor": on_cpu(aten._ctc_loss.Tensor),
            "_ctc_loss_backward": on_cpu(aten._ctc_loss_backward.default),
            "_ctc_loss_backward.Tensor": on_cpu(aten._ctc_loss_backward.Tensor),
        }
    )


def revert() -> None:
    _kernels.remove()
