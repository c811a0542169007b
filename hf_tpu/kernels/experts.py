"""The experts implementation and the ragged_dot_experts_not_registered/G14/G16 patches behind :mod:`hf_tpu.kernels` (see its docstring).

torch is imported inside functions: the autoload loads this module from inside ``import torch``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import sys
import types
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from hf_tpu.fixes import Fix, install_patches
from hf_tpu.plumbing.backend import on_tpu

if TYPE_CHECKING:
    import torch


EXPERTS_IMPLEMENTATION = "tokamax_ragged_dot"
KERNEL_DIR = Path(__file__).parent / "ragged_dot_tpu"
HUB_REPOS = ("kernels-community/ragged-dot-tpu", "tengomucho/ragged-dot-tpu")
_V2_MIN = (0, 0, 13)  # the Hub kernel calls tokamax's mosaic_tpu_v2, first in 0.0.13 (Python >= 3.12)


def _set_kernels_backend() -> None:
    """kernels_cannot_see_the_tpu: kernels' ``_backend()`` returns TPU iff ``torch.backends.tpu`` exists; TorchTPU 0.2.0 never sets it."""
    import torch

    if on_tpu() and not hasattr(torch.backends, "tpu"):
        marker = types.ModuleType("torch.backends.tpu", "Set by hf-tpu so kernels selects build/torch-tpu variants.")
        marker.is_available = lambda: True  # type: ignore[attr-defined]
        torch.backends.tpu = marker  # type: ignore[attr-defined]


_kernel: ModuleType | None = None  # a plain global, so torch.compile reads it instead of tracing the loader


def _shipped_kernel() -> ModuleType:
    global _kernel
    if _kernel is None:
        from kernels import get_local_kernel

        _set_kernels_backend()
        _kernel = get_local_kernel(KERNEL_DIR)
    return _kernel


def load_ragged_dot_kernel(repo_id: str | None = None, *, version: int = 1) -> ModuleType:
    """The ``ragged-dot-tpu`` kernel module: the copy shipped in hf-tpu (offline, no trust check) by default, or
    ``repo_id`` from the Kernels Hub, trusting only the known ragged-dot repos."""
    if repo_id is None:
        return _shipped_kernel()
    from kernels import get_kernel

    _set_kernels_backend()
    return get_kernel(repo_id, version=version, trust_remote_code=[r for r in HUB_REPOS if r == repo_id])


def tokamax_ragged_dot_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """What ``experts_implementation="tokamax_ragged_dot"`` runs: the shipped kernel's ``experts_forward``."""
    kernel = _kernel if _kernel is not None else _shipped_kernel()
    return kernel.experts_forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs)


# ---- ragged_dot_experts_not_registered: "tokamax_ragged_dot" is a valid experts_implementation before any from_pretrained ----------------
def register_experts_implementation(module: ModuleType) -> None:
    """transformers.integrations.moe: register the name class-wide (as the blog's snippet does), unless the user
    already registered one; a later explicit ``register`` replaces ours (idempotent either way)."""
    interface = module.ExpertsInterface
    if EXPERTS_IMPLEMENTATION not in interface._global_mapping:
        interface.register(EXPERTS_IMPLEMENTATION, tokamax_ragged_dot_experts_forward)


# ---- kernels_cannot_see_the_tpu: kernels selects TPU builds on a tpu device -------------------------------------------------
def kernels_tpu_backend(module: ModuleType) -> None:
    """kernels.backends: expose ``torch.backends.tpu`` on a (real or emulated) TPU before kernels looks."""
    _set_kernels_backend()


# ---- hub_kernels_need_the_network: the Hub ragged-dot kernel, offline or with a tokamax too old for it -----------------------------
def _tokamax_too_old() -> bool:
    if importlib.util.find_spec("tokamax") is None:
        return False  # the Hub kernel's own import error names what is missing
    from packaging.version import Version

    return Version(importlib.metadata.version("tokamax")).release < _V2_MIN


def hub_kernel_fallback(module: ModuleType) -> None:
    """kernels.load (kernels._internals.load from 0.19; and the ``kernels`` package's binding of it, if already
    made): on a TPU, ``get_kernel`` of
    a known ragged-dot repo loads the shipped copy when the Hub cannot serve it (offline, no cache) or when
    tokamax < 0.0.13 (Python 3.11) cannot run the Hub build's ``mosaic_tpu_v2``. Other repos and non-TPU processes are untouched."""
    original = module.get_kernel
    if getattr(original, "__hf_tpu__", False):
        return

    @functools.wraps(original)
    def get_kernel(repo_id: str, *args: Any, **kwargs: Any) -> ModuleType:
        if repo_id not in HUB_REPOS or not on_tpu():
            return original(repo_id, *args, **kwargs)
        if _tokamax_too_old():
            warnings.warn(
                f"hf-tpu: {repo_id} needs tokamax>=0.0.13 (Python>=3.12) for mosaic_tpu_v2; installed is "
                f"{importlib.metadata.version('tokamax')}. Using hf-tpu's shipped ragged-dot-tpu build instead.",
                stacklevel=2,
            )
            return _shipped_kernel()
        _set_kernels_backend()
        try:
            return original(repo_id, *args, **kwargs)
        except Exception as err:  # offline without cache, no network (httpx errors), trust check unreachable, ...
            warnings.warn(
                f"hf-tpu: could not load {repo_id} from the Kernels Hub ({type(err).__name__}: {err}); using "
                "hf-tpu's shipped ragged-dot-tpu build (same experts_forward contract).",
                stacklevel=2,
            )
            return _shipped_kernel()

    get_kernel.__hf_tpu__ = True  # type: ignore[attr-defined]
    module.get_kernel = get_kernel
    package = sys.modules.get("kernels")  # `import kernels` binds kernels.load.get_kernel after loading it
    if package is not None and getattr(package, "get_kernel", None) is original:
        package.get_kernel = get_kernel


PATCHES: tuple[Fix, ...] = (
    Fix.patch("ragged_dot_experts_not_registered", "transformers.integrations.moe", register_experts_implementation),
    # kernels 0.18 picks TPU builds from torch.accelerator itself
    Fix.patch(
        "kernels_cannot_see_the_tpu",
        "kernels.backends",
        kernels_tpu_backend,
        targets={"<0.18": "kernels.backends", ">=0.18": None},
    ),
    # kernels 0.19 moved its loaders to kernels._internals (re-exported as kernels.get_kernel)
    Fix.patch(
        "hub_kernels_need_the_network",
        "kernels.load",
        hub_kernel_fallback,
        targets={"<0.19": "kernels.load", ">=0.19": "kernels._internals.load"},
    ),
)


def install() -> None:
    """Attach this integration's hooks when its library is imported. Idempotent."""
    install_patches(PATCHES)
