"""Count what one rank reads from safetensors checkpoints, to check that TP loading reads ~1/N.

Two numbers, both per process:

- ``copied``: bytes of tensors this process copied out of the files (``get_slice(...)[...]``,
  ``get_tensor``): what shard-on-read saves.
- ``touched``: bytes of the files' memory maps resident in this process when each file is closed
  (``Rss`` in ``/proc/self/smaps``): pages the kernel had to bring in for it. A row-wise slice is strided, so
  it touches every page of a tensor whose rows are shorter than a few pages.

Call :func:`install` before transformers / diffusers are imported (they bind ``safe_open`` by name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reads:
    copied: int = 0
    touched: int = 0
    files: set[str] = field(default_factory=set)

    def reset(self) -> None:
        self.copied = self.touched = 0
        self.files.clear()


reads = Reads()
_original: Any = None


def _mapped_rss(path: str) -> int:
    """Resident bytes of this process's mappings of ``path``."""
    real = os.path.realpath(path)
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(maxsplit=5)
                if len(head) >= 5 and "-" in head[0] and ":" not in head[0]:
                    inside = len(head) == 6 and head[5].strip() == real
                elif inside and line.startswith("Rss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class _Slice:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getitem__(self, index: Any) -> Any:
        out = self._inner[index]
        reads.copied += out.numel() * out.element_size()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _File:
    def __init__(self, path: str, inner: Any) -> None:
        self._path, self._inner, self._closed = str(path), inner, False
        reads.files.add(os.path.realpath(self._path))

    def get_slice(self, key: str) -> _Slice:
        return _Slice(self._inner.get_slice(key))

    def get_tensor(self, key: str) -> Any:
        out = self._inner.get_tensor(key)
        reads.copied += out.numel() * out.element_size()
        return out

    def __enter__(self) -> _File:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        if not self._closed:
            self._closed = True
            reads.touched += _mapped_rss(self._path)
        return self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install() -> None:
    """Wrap ``safetensors.safe_open`` so :data:`reads` counts this process's checkpoint reads."""
    global _original
    import safetensors

    if _original is not None:
        return
    _original = safetensors.safe_open

    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> _File:
        return _File(filename, _original(filename, *args, **kwargs))

    safetensors.safe_open = safe_open
