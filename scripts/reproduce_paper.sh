#!/usr/bin/env bash
# The whole reproduction for one model and method; each stage skips what is already done.
#   MODEL=Qwen/Qwen2.5-3B-Instruct PRESET=grpo_llds STEP=650 PAPER_ROW="3B-Ins GRPO+LLDS" bash scripts/reproduce_paper.sh
# Stages: wiki-18 + indexes -> FlashRAG data -> retriever (e5 flat on GPUs) -> training -> merge the
# chosen checkpoint to HF format -> evaluation table beside the paper's row.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
PRESET=${PRESET:-grpo_llds}
STEP=${STEP:-650}
WIKI18=${WIKI18:-data/wiki18}
EXP=${EXP:-${PRESET}_$(basename "$MODEL")}
CKPT_DIR=checkpoints/search_r1_llds/$EXP
PAPER_ROW=${PAPER_ROW:-}

[ -f "$WIKI18/e5_Flat.index" ] && [ -f "$WIKI18/wiki-18.jsonl" ] || bash scripts/download_wiki18.sh "$WIKI18" corpus,e5
[ -f "$DATA_DIR/train.parquet" ] && [ -f "$DATA_DIR/test.parquet" ] || bash scripts/download_data.sh

base=${RETRIEVER_URL%/retrieve}
if ! "$PY" -m retrieval.client "$base"; then
  echo "starting the e5 retriever (log: runs/retriever.log) ..."
  mkdir -p runs
  RETRIEVER=e5 WIKI18=$WIKI18 nohup bash retrieval_launch.sh > runs/retriever.log 2>&1 &
  "$PY" -m retrieval.client "$base" --wait 1800 || { echo "the retriever did not come up; see runs/retriever.log" >&2; exit 1; }
fi

if [ ! -d "$CKPT_DIR/global_step_$STEP" ]; then
  (source scripts/_common.sh; run_preset "$PRESET" trainer.experiment_name="$EXP" \
     trainer.default_local_dir="$CKPT_DIR" "checkpoints.keep_steps=[$STEP]" "$@")
fi

HF_DIR=$CKPT_DIR/global_step_$STEP/hf
if [ ! -f "$HF_DIR/config.json" ]; then
  "$PY" -m verl.model_merger merge --backend fsdp --local_dir "$CKPT_DIR/global_step_$STEP/actor" --target_dir "$HF_DIR"
fi

ARGS=(); [ -n "$PAPER_ROW" ] && ARGS=(--paper-row "$PAPER_ROW")
bash scripts/evaluate.sh "$HF_DIR" --out "runs/eval/$EXP-step$STEP.jsonl" "${ARGS[@]}"
