#!/usr/bin/env bash
# Install hf-tpu and its pinned dependencies into the current Python (>= 3.11), then build
# the emulated TPU's C++ core once. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"   # first and pinned: never a CUDA build
python -m pip install --quiet -c constraints.txt -e ".[test]"
TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -c "import hf_tpu.emulator as e; print('hf-tpu: core ready in', e.build())"
