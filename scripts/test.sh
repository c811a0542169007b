#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, run the test suite on the emulated TPU (on the pinned versions, then on the
# newest releases: scripts/latest.sh), then the longer jobs: the tests marked
# long (over 30 s each), the multi-host job (2 emulated hosts x 2 chips), the contract (the emulator's torch.tpu
# against the real torch-tpu wheel, its environment built once under $HF_TPU_CACHE/contract) and the CI harness on
# upstream's test suites (python -m ci, the sdists fetched once under $HF_TPU_CACHE/ci), and the suite again on the real
# torch-tpu wheel on XLA:CPU (its environment built once under $HF_TPU_CACHE/xla-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ruff check .
ruff format --check .
python -m pytest tests -q -p no:cacheprovider --ignore=tests/contract --ignore=tests/harness \
    --ignore=tests/multihost --ignore=tests/xla_cpu -m "not long" "$@"
bash scripts/latest.sh
python -m pytest tests -q -p no:cacheprovider --ignore=tests/contract --ignore=tests/harness \
    --ignore=tests/multihost --ignore=tests/xla_cpu -m long
python -m pytest tests/multihost -q -p no:cacheprovider
HF_TPU_CONTRACT_REQUIRED=1 python -m pytest tests/contract -q -p no:cacheprovider
python -m pytest tests/harness -q -p no:cacheprovider
bash scripts/xla_cpu.sh
