"""Stand-in for upstream's ``tests/generation/test_utils.py``, which the transformers sdist does not ship.

``ModelTesterMixin`` imports ``GenerationTesterMixin`` and checks that generative models' testers
inherit it. This stand-in has no tests: generation tests run only from a checkout (``--suite-dir``),
and the report says so.
"""


class GenerationTesterMixin:
    """No generate() tests in an sdist run (see the module docstring)."""
