#!/usr/bin/env bash
# One node, N GPUs: the grpo_llds_r preset (configs/grpo_llds_r.yaml). Env: MODEL, DATA_DIR, N_GPUS, RETRIEVER_URL.
# Extra arguments are Hydra overrides, e.g.  bash scripts/train_llds_r.sh trainer.total_training_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
run_preset grpo_llds_r "$@"
