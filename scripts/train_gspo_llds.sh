#!/usr/bin/env bash
# One node, N GPUs: the gspo_llds preset (configs/gspo_llds.yaml: GSPO + LLDS-A, Qwen2.5-3B-Instruct). Env: MODEL, DATA_DIR, N_GPUS, RETRIEVER_URL.
# Extra arguments are Hydra overrides, e.g.  bash scripts/train_gspo_llds.sh trainer.total_training_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-Qwen/Qwen2.5-3B-Instruct}   # the paper's GSPO + LLDS row
source scripts/_common.sh
run_preset gspo_llds "$@"
