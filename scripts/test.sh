#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, then run the whole test suite on the emulated TPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
ruff format --check .
python -m pytest tests -q -p no:cacheprovider "$@"
