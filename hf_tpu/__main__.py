"""``python -m hf_tpu`` is the ``hf-tpu`` command."""

import sys

from hf_tpu.commands import main

sys.exit(main())
