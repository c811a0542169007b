#!/usr/bin/env bash
# Set up, then run the main job: the Transformers generate example (a real TPU if present,
# otherwise the emulated one with a small local model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
HF_TPU_EMULATE="${HF_TPU_EMULATE:-1}" python examples/transformers_generate.py "$@"
