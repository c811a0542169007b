"""``python -m hf_tpu`` is the ``hf-tpu`` command."""

import sys

from .cli import main

sys.exit(main())
