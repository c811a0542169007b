"""(work in progress)"""

from __future__ import annotations


def install() -> None:
    """Attach this integration's hooks when its library is imported. Idempotent."""
