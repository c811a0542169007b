# ruff: noqa: N999  (kernels names the variant directory torch-tpu)
"""Compatibility package for older kernels releases: re-exports the variant's API."""

from .. import *  # noqa: F403
from .. import __all__  # noqa: F401
