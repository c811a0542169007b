#!/usr/bin/env bash
# The test suite on the real torch-tpu wheel, its programs run by XLA's CPU plugin (HF_TPU_XLA_CPU=1), in an
# environment of its own (hf-tpu with the xla-cpu extra, built once under $HF_TPU_CACHE/environments by
# tests/environments.py). Tests marked emulator_only are skipped; tests/xla_cpu_expected_failures.txt lists the
# ones that must fail, each with its cause (a TorchTPU gap or an XLA:CPU limit).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(python -m tests.environments xla-cpu)
HF_TPU_XLA_CPU=1 "$python" -m pytest tests -q -p no:cacheprovider --ignore=tests/contract --ignore=tests/harness \
    --ignore=tests/multihost -m "not long" "$@"
