#!/usr/bin/env bash
# Set up, then run the main job: the Transformers generate example. It runs on a real TPU
# when one is present, otherwise it switches the emulated TPU on with a small local model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python examples/transformers_generate.py "$@"
