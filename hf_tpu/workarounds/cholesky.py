"""Gap ``cholesky``: Cholesky factorisations run on the host, so ``resize_token_embeddings`` works.

TorchTPU has no kernel for ``linalg_cholesky_ex`` / ``cholesky`` / ``cholesky_inverse``; the factorisation of a covariance
matrix is small (embedding width squared), so a round trip through the CPU costs little.
Autograd is unchanged (the derivative formula sits above the kernel).
"""

from __future__ import annotations

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Kernels, on_cpu

_kernels = Kernels()


def apply() -> None:
    _kernels.register(
        {
            "linalg_cholesky_ex": on_cpu(torch.ops.aten.linalg_cholesky_ex.default),
            "cholesky": on_cpu(torch.ops.aten.cholesky.default),
            "cholesky_inverse": on_cpu(torch.ops.aten.cholesky_inverse.default),
        }
    )


def revert() -> None:
    _kernels.remove()


WORKAROUNDS = (
    Fix.workaround(
        "cholesky_on_cpu",
        "cholesky",
        "aten::linalg_cholesky_ex, cholesky, cholesky_inverse (tpu kernels)",
        __doc__,
        apply,
        revert,
    ),
)
