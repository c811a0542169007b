"""Gap ``record_stream``: ``Tensor.record_stream`` on tpu is a no-op.

On CUDA it tells the caching allocator not to reuse a block until a side stream is done with it.
TorchTPU orders work by data dependencies (its streams exist so FSDP works, and ``torch.tpu.stream``
is documented as not yet functional), so there is nothing to record; diffusers' group offloading
with ``use_stream=True`` calls it on every transfer.
"""

from __future__ import annotations

import torch

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import Kernels

_kernels = Kernels()


def _record_stream(self: torch.Tensor, stream: torch.Stream) -> None:
    return None


def apply() -> None:
    _kernels.register({"record_stream": _record_stream})


def revert() -> None:
    _kernels.remove()


WORKAROUNDS = (
    Fix.workaround("record_stream_noop", "record_stream", "aten::record_stream (tpu kernel)", __doc__, apply, revert),
)
