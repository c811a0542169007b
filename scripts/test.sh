#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, run the test suite on the emulated TPU, then two longer jobs: the contract (the
# emulator's torch.tpu against the real torch-tpu wheel, its environment built once under $HF_TPU_CACHE/contract)
# and the CI harness on upstream's test suites (python -m ci, the sdists fetched once under $HF_TPU_CACHE/ci).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
ruff format --check .
python -m pytest tests -q -p no:cacheprovider --ignore=tests/contract --ignore=tests/harness "$@"
HF_TPU_CONTRACT_REQUIRED=1 python -m pytest tests/contract -q -p no:cacheprovider
python -m pytest tests/harness -q -p no:cacheprovider
