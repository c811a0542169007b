"""Compiled programs that outlive the process: a second process running the same workload compiles nothing new.

- **TorchTPU** (a chip, or the real wheel on XLA:CPU) keeps executables in memory (tier 1), on the host in
  ``/dev/shm`` (tier 2, shared by the processes of one host) and in a persistent directory, local or ``gs://``
  (tier 3, ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``; turning it on turns tier 2 on too). Its keys carry
  TorchTPU's binary fingerprint, so another release misses. Measured on the real torch-tpu 0.2.0 (XLA:CPU),
  generate of 54 tokens on a tiny Qwen3: 301 compilations in the first process, 0 in the second. When the user
  set neither cache variable, hf-tpu points tier 3 at ``$HF_TPU_CACHE/torch_tpu/<tpu|xla_cpu>`` (one directory per
  platform: an XLA:CPU executable is no use to a chip) before TorchTPU first reads it, and names tier 2 after it
  (TorchTPU's default name, "default", is shared by every process of the host whatever its ``HF_TPU_CACHE``).
- **The emulator** compiles its graphs with Inductor, whose FX-graph and AOTAutograd caches live on disk and are
  keyed by the graph (the emulator's numerics are rewritten into it), torch's version and Inductor's config; hf-tpu
  puts them under ``$HF_TPU_CACHE/inductor`` when ``TORCHINDUCTOR_CACHE_DIR`` is unset (see
  ``hf_tpu.emulator.graph_cache``); the keys of its modelled eager executables go to
  ``$HF_TPU_CACHE/emulator_executables`` (``hf_tpu.emulator.executables``).

``HF_TPU_COMPILE_CACHE=0`` leaves every cache setting to the user. ``hf-tpu env`` shows the directories, their
size and how to clear them (delete the directory; nothing else refers to it).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

from hf_tpu import settings
from hf_tpu.plumbing.cache import cache_root

SWITCH = "HF_TPU_COMPILE_CACHE"
TIER2 = "TORCH_TPU_TIER2_COMPILATION_CACHE"
TIER3 = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"


def enabled() -> bool:
    return settings.get(SWITCH)


def torch_tpu_dir(platform: str) -> Path:
    return cache_root() / "torch_tpu" / platform


def inductor_dir() -> Path:
    return cache_root() / "inductor"


def emulator_executables_dir() -> Path:
    return cache_root() / "emulator_executables"


def tier2_name(directory: Path) -> str:
    """The name of TorchTPU's host-memory cache (``/dev/shm/torch_tpu_cache/<name>``) that goes with a tier-3
    directory of hf-tpu's."""
    return "hf-tpu-" + hashlib.sha256(str(directory).encode()).hexdigest()[:12]


def use_torch_tpu_cache(platform: str) -> Path | None:
    """Point TorchTPU's tier-3 cache at hf-tpu's cache directory, unless the user configured TorchTPU's caches or
    turned this off. Call before the first compilation (TorchTPU reads the variable once). Returns the directory."""
    if not enabled() or settings.is_set(TIER2) or settings.is_set(TIER3):
        return None
    directory = torch_tpu_dir(platform)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(
            f"hf-tpu: cannot create {directory} for TorchTPU's compilation cache ({err}); compiled programs will not "
            "outlive the process. Point HF_TPU_CACHE at a writable directory, or set HF_TPU_COMPILE_CACHE=0.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    os.environ[TIER3] = str(directory)
    # Tier 2 (host memory, /dev/shm) follows tier 3 under the name "default", shared by every process of the host
    # whatever its HF_TPU_CACHE: named after the tier-3 directory, one HF_TPU_CACHE is one cache (a fresh one misses,
    # `hf-tpu env` shows and clears both).
    os.environ[TIER2] = tier2_name(directory)
    # TorchTPU warns that the variable is experimental the first time it reads it; hf-tpu set it, not the user.
    warnings.filterwarnings("ignore", message=f".*the {TIER3} environment variable is an experimental feature")
    return directory
