"""Op namespace of this build (kernel-builder generates this file): unique, so it can coexist with the Hub copy."""

import torch

_NAMESPACE = "_ragged_dot_tpu_tpu_hf_tpu_1"
ops = getattr(torch.ops, _NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op names with this kernel's namespace."""
    return f"{_NAMESPACE}::{op_name}"
