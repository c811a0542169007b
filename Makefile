SHELL := /bin/bash
.PHONY: setup demo test long multihost contract harness xla-cpu latest bench

# Install everything (torch pinned first) and build the emulator core.
setup:
	bash scripts/setup.sh

# The main job: generate on "tpu" (the emulated TPU when no TPU is present).
demo:
	bash scripts/demo.sh

# Lint and the whole test suite (what CI runs).
test:
	bash scripts/test.sh

# The tests marked long (over 30 s each: hf-tpu check --run, hf-tpu gaps over every probe; part of `make test`).
long:
	python -m pytest tests -q -p no:cacheprovider --ignore=tests/contract --ignore=tests/harness --ignore=tests/multihost \
		--ignore=tests/xla_cpu -m long

# Two emulated hosts x two chips: hybrid TP + DP training, layout, generate, a killed host, restarts (part of `make test`).
multihost:
	python -m pytest tests/multihost -q -p no:cacheprovider

# The suite on the real torch-tpu wheel running on XLA:CPU, in its own environment (built once; part of `make test`).
xla-cpu:
	bash scripts/xla_cpu.sh

# The default suite on the newest releases of the dependencies (constraints-latest.txt), in its own environment.
latest:
	bash scripts/latest.sh

# The emulator's torch.tpu against the real torch-tpu wheel (builds its environment once; part of `make test`).
contract:
	HF_TPU_CONTRACT_REQUIRED=1 python -m pytest tests/contract -q -p no:cacheprovider

# python -m ci on upstream's tests (transformers sdist: 3 families + planted failures; diffusers SD3/Flux), tpu vs CPU.
harness:
	python -m pytest tests/harness -q -p no:cacheprovider

# Every benchmark, one run each, printing ratios (several minutes on 2 cores).
bench: setup
	set -e; for script in emulator_overhead compile generate load diffusion moe_decode tp_load multihost; do \
		echo "== bench/$$script.py"; python bench/$$script.py; done
