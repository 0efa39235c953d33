#!/usr/bin/env bash
# One node, N GPUs: the grpo_llds_ma preset (configs/grpo_llds_ma.yaml). Env: MODEL, DATA_DIR, N_GPUS, RETRIEVER_URL.
# Extra arguments are Hydra overrides, e.g.  bash scripts/train_llds_ma.sh trainer.total_training_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
: "${MODEL:=Qwen/Qwen2.5-3B}"   # the released MA run: Qwen2.5-3B base
run_preset grpo_llds_ma "$@"
