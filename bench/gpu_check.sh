#!/usr/bin/env bash
# The prepared GPU check (bench/gpu_check.py): every GPU path that needs no vLLM, verl or Ray, in one
# table, non-zero on any mismatch. Needs only python3 with torch (CUDA build) and transformers, as on
# the lent GPU machine's image; run from anywhere:
#   bash bench/gpu_check.sh              # on a GPU (< 8 min on one H200)
#   bash bench/gpu_check.sh --cpu        # dry mode on CPU: the script's own parts, small sizes
# PYTHON picks the interpreter (default: the active environment's python3, never .venv first).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout -k 10 ${GPU_CHECK_TIMEOUT:-480} "$PYTHON" bench/gpu_check.py "$@"
