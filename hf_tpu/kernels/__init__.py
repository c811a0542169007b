"""MoE experts on TPU: ``experts_implementation="tokamax_ragged_dot"`` with no user code, and kernels on TPU.

hf-tpu ships the ``ragged-dot-tpu`` kernel in kernels' layout (``ragged_dot_tpu/build/torch-tpu/``) and loads it
offline with ``kernels.get_local_kernel``. Patches, one per upstream gap:

- ragged_dot_experts_not_registered: ``"tokamax_ragged_dot"`` is in ``ALL_EXPERTS_FUNCTIONS`` as soon as transformers' MoE module is imported, so
  ``from_pretrained(..., experts_implementation="tokamax_ragged_dot")`` validates; the kernel loads on first call.
- kernels_cannot_see_the_tpu: kernels picks ``build/torch-tpu`` variants on a tpu device (kernels < 0.18 looks for ``torch.backends.tpu``;
  from 0.18 it asks ``torch.accelerator`` itself: not needed).
- hub_kernels_need_the_network: on a TPU, ``get_kernel("kernels-community/ragged-dot-tpu")`` (or the blog's ``tengomucho/ragged-dot-tpu``)
  falls back to the shipped copy when the Hub cannot serve it, or when the installed tokamax is too old for it
  (``kernels.load``; ``kernels._internals.load`` from kernels 0.19).

Everything is installed only on a real or emulated TPU (``install()`` runs at set-up), and each patch re-checks
the device, so other users of the same process see upstream behaviour. This module stays import-light: the
autoload imports it from inside ``import torch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_tpu.kernels.experts import (
        EXPERTS_IMPLEMENTATION,
        HUB_REPOS,
        KERNEL_DIR,
        load_ragged_dot_kernel,
        tokamax_ragged_dot_experts_forward,
    )

__all__ = [
    "EXPERTS_IMPLEMENTATION",
    "HUB_REPOS",
    "KERNEL_DIR",
    "install",
    "load_ragged_dot_kernel",
    "tokamax_ragged_dot_experts_forward",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from hf_tpu.kernels import experts

        return getattr(experts, name)
    raise AttributeError(f"module 'hf_tpu.kernels' has no attribute {name!r}")


def install() -> None:
    """Attach this integration's hooks when its library is imported. Idempotent."""
    from hf_tpu.kernels.experts import install as _install

    _install()
