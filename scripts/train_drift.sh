#!/usr/bin/env bash
# One node, N GPUs: the grpo_drift preset (configs/grpo_drift.yaml: GRPO + SAPO's drift penalty, the rival of
# LLDS). Env: MODEL, DATA_DIR, N_GPUS, RETRIEVER_URL.
# Extra arguments are Hydra overrides, e.g.  bash scripts/train_drift.sh trainer.total_training_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
run_preset grpo_drift "$@"
