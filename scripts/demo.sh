#!/usr/bin/env bash
# Set up, then run the main job: train a small model on "tpu" and let it write, beside the same run on CPU.
# It runs on a real TPU when one is present, otherwise on the emulated TPU (about a minute on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python examples/train_demo.py "$@"
