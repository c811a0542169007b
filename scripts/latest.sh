#!/usr/bin/env bash
# The upstream-facing part of the default suite again, on the newest releases of hf-tpu's dependencies (constraints-latest.txt, written by
# scripts/latest_constraints.py), in an environment of its own built once under $HF_TPU_CACHE/environments. When
# that file pins what constraints.txt pins, the suite has already run on those versions and this says so.
set -euo pipefail
cd "$(dirname "$0")/.."
if python scripts/latest_constraints.py --same; then
    echo "latest: constraints-latest.txt pins what constraints.txt pins; the default suite already ran on them"
    exit 0
fi
python=$("$(command -v python)" -m tests.environments latest)
# The tests that run the upstream libraries' code (the emulator's own tests depend on torch alone, pinned alike).
"$python" -m pytest tests/transformers tests/diffusers tests/kernels tests/accelerate tests/tp tests/integration \
    tests/test_fixes_versions.py tests/test_check.py tests/test_examples.py -q -p no:cacheprovider -m "not long" "$@"
