"""hf-tpu's environment variables, read and checked in one place.

A value hf-tpu cannot use is an error naming the variable, the value and what it accepts: a typo in
``HF_TPU_STRICT_RECOMPILE=2`` must not quietly mean "off".
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class EnvError(ValueError):
    """An hf-tpu environment variable holds a value hf-tpu cannot use."""


def flag(name: str, default: bool = False) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off (unset or empty: ``default``)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a yes/no value: use 1 (or true/yes/on) or 0 (false/no/off), or unset it.")


def choice(name: str, choices: Iterable[str], default: str | None = None) -> str | None:
    """One of ``choices`` (unset or empty: ``default``)."""
    raw = os.environ.get(name, "")
    value = raw.strip()
    if not value:
        return default
    options = tuple(choices)
    if value not in options:
        raise EnvError(f"{name}={raw!r} is not one of {', '.join(map(repr, options))}; set one of them or unset it.")
    return value


def seconds(name: str, default: float) -> float:
    """A positive number of seconds (unset or empty: ``default``)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise EnvError(
            f"{name}={raw!r}: give a number of seconds greater than 0 (default {default:g}); a wait without end "
            "would hang on a peer that never comes."
        )
    return value
