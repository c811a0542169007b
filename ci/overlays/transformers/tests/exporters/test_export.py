"""Stand-in for upstream's ``tests/exporters/test_export.py``, which the transformers sdist does not ship.

``ModelTesterMixin`` derives from ``ExportTesterMixin``; export tests run only from a checkout.
"""


class ExportTesterMixin:
    """No torch.export tests in an sdist run (see the module docstring)."""
