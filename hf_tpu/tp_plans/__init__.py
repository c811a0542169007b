"""Tensor-parallel plans for TPU: a registry keyed by model class, a validator, a derivation helper, and
the hooks that make ``tp_plan="auto"`` / ``TensorParallelConfig`` work on TPU chips.

- :func:`register` / :func:`get` / :func:`registered`: plans applied when a model ships none (SD3's
  transformer, T5, Qwen3-VL, OPT, gpt-oss dense parts; see ``_builtin``).
- :func:`validate_plan`: checks a plan against a model (a meta model works) for N chips; errors name the
  module and the number that does not divide. The hooks run it before any weight is read.
- :func:`derive_plan`: proposes a plan for an unknown model from its module names.

Hooks attach when transformers / diffusers are imported (gaps tp_plan_without_a_launch, tp_mesh_not_topology_aware, models_without_a_tp_plan, tp_device_index_differs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hf_tpu.tp_plans._core import (
        HEAD_ATTRS,
        DerivedPlan,
        IfPresent,
        PlanError,
        PlanReport,
        TPPlan,
        derive_plan,
        divide_heads,
        generic_name,
        get,
        plan_for,
        register,
        registered,
        validate_plan,
    )

__all__ = [
    "HEAD_ATTRS",
    "DerivedPlan",
    "IfPresent",
    "PlanError",
    "PlanReport",
    "TPPlan",
    "derive_plan",
    "divide_heads",
    "generic_name",
    "get",
    "install",
    "plan_for",
    "register",
    "registered",
    "validate_plan",
]

_installed = False


def __getattr__(name: str) -> Any:
    # Lazy, so that importing this package (or its `measure` module) before torch cannot re-enter torch's
    # autoload, which calls install().
    if name in __all__ and name != "install":
        from hf_tpu.tp_plans import _core

        return getattr(_core, name)
    raise AttributeError(f"module 'hf_tpu.tp_plans' has no attribute {name!r}")


def install() -> None:
    """Register the built-in plans and attach the library hooks when (or now, if) the libraries are imported.

    Called at set-up on a real or emulated TPU only. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    from hf_tpu.fixes import install_patches
    from hf_tpu.tp_plans import diffusers as _diffusers
    from hf_tpu.tp_plans import transformers as _transformers
    from hf_tpu.tp_plans._builtin import register_builtin

    register_builtin()
    install_patches((*_transformers.PATCHES, *_diffusers.PATCHES))
