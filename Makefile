SHELL := /bin/bash
.PHONY: setup demo test bench

# Install everything (torch pinned first) and build the emulator core.
setup:
	bash scripts/setup.sh

# The main job: generate on "tpu" (the emulated TPU when no TPU is present).
demo:
	bash scripts/demo.sh

# Lint and the whole test suite (what CI runs).
test:
	bash scripts/test.sh

bench: setup
	python bench/emulator_overhead.py
