"""Gap ``compile_options_ignored``: a ``torch.compile(backend="tpu", options=...)`` key the backend does not read
gets a warning naming it and the keys it reads.

TorchTPU's backend reads its options with ``dict.get``, so a misspelt key (``"async_compil"``) or one of Inductor's
(``"triton.cudagraphs"``) silently does nothing. Nothing else changes: the options still go to the backend as given.
"""

from __future__ import annotations

import warnings
from typing import Any

from hf_tpu.fixes import Fix
from hf_tpu.workarounds._tools import tpu_compile_hooks

NAME = "unknown_compile_options_warn"
# The keys TorchTPU 0.2.0's TpuBackend reads (and "tpu_backend", which its Inductor guard reads).
KNOWN = frozenset(
    {"async_compile", "num_dynamic_buckets", "bucket_size", "serializable", "debug_callback", "custom_module_name",
     "name", "tpu_backend"}
)  # fmt: skip


def _warn_unknown(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        warnings.warn(
            f"hf-tpu: the 'tpu' compile backend ignores the unknown option(s) {unknown} (TorchTPU reads only "
            f"{sorted(KNOWN - {'tpu_backend'})}); check the spelling.",
            UserWarning,
            stacklevel=4,
        )


def apply() -> None:
    tpu_compile_hooks.add(NAME, check=_warn_unknown)


def revert() -> None:
    tpu_compile_hooks.remove(NAME)


WORKAROUNDS = (
    Fix.workaround(
        NAME, "compile_options_ignored", "torch.compile(backend='tpu', options=...)", __doc__, apply, revert
    ),
)
