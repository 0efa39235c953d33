#!/usr/bin/env bash
# The GPU check (python -m train.gpu_check; installed: search-r1-gpu-check), from the checkout without
# installing the project: every GPU path that needs no vLLM, verl or Ray, in one table, non-zero on any
# mismatch. Needs only python3 with torch (CUDA build) and transformers, as on a lent GPU machine's image;
# run from anywhere:
#   bash bench/gpu_check.sh              # on a GPU (< 8 min on one H200)
#   bash bench/gpu_check.sh --cpu        # dry mode on CPU: the check's own parts, small sizes
# PYTHON picks the interpreter (default: the active environment's python3, never .venv first);
# GPU_CHECK_TIMEOUT (default 480 s) bounds the run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
exec "$PYTHON" -m train.gpu_check "$@"
