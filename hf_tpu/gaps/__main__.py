"""``python -m hf_tpu.gaps``: the gap table of docs/gaps.md, from the records."""

import sys

from hf_tpu.gaps import markdown

sys.stdout.write(markdown())
