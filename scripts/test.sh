#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, run the test suite on the emulated TPU, then the contract job: the emulator's
# torch.tpu against the real torch-tpu wheel (its environment is built once under $HF_TPU_CACHE/contract).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
ruff format --check .
python -m pytest tests -q -p no:cacheprovider --ignore=tests/contract "$@"
HF_TPU_CONTRACT_REQUIRED=1 python -m pytest tests/contract -q -p no:cacheprovider
