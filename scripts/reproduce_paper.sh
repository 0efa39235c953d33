#!/usr/bin/env bash
# The whole reproduction of one row of the paper's table; each stage skips what is already done.
#   MODEL=Qwen/Qwen2.5-3B-Instruct PRESET=grpo_llds bash scripts/reproduce_paper.sh [hydra overrides...]
# MODEL and PRESET pick the row of train/evaluation/paper_results.json, the checkpoint step the paper evaluated
# and LLDS's lambda from one table (train/paper_runs.py: 7B-Instruct lambda 0.3, else 0.2; step 650
# 3B-Ins, 600 3B-Base, 450 7B-Base, 650 7B-Ins). Baseline rows (grpo, ppo) are "the best checkpoint
# before collapse": without STEP the run keeps every checkpoint, each is evaluated on the validation
# sample (python -m train.evaluate --checkpoints; CKPT_DIR/eval/, its default) and the best step is taken.
# STEP, LAMBDA and PAPER_ROW in the environment override the table (a model it does not know, a local
# one say, needs PAPER_ROW, and STEP unless the best step is wanted); EVAL_ARGS are passed to
# train.evaluate on the test set (EVAL_OUT names its jsonl), STEPS_ARGS to the per-checkpoint evaluation.
# Stages: wiki-18 + indexes -> FlashRAG data -> retriever (e5 flat on GPUs) -> training -> merge the
# chosen checkpoint to HF format -> evaluation table beside the paper's row.
source "$(dirname "$0")/_group.sh"  # a TERM to this script stops its stages too
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
PRESET=${PRESET:-grpo_llds}
USER_ROW=${PAPER_ROW:-}
PAPER_STEP= PAPER_LAMBDA=
if RUN=$("$PY" -m train.paper_runs "$MODEL" "$PRESET" 2>/tmp/paper_runs.$$); then
  eval "$RUN"
elif [ -z "$USER_ROW" ]; then  # a model the table does not know: PAPER_ROW says which row
  cat /tmp/paper_runs.$$ >&2; rm -f /tmp/paper_runs.$$
  echo "  (another model, e.g. a local one: set PAPER_ROW=<row of train/evaluation/paper_results.json>, and STEP=<step>" >&2
  echo "   unless the best checkpoint is wanted)" >&2
  exit 2
fi
rm -f /tmp/paper_runs.$$
STEP=${STEP:-$PAPER_STEP}
[ "$STEP" = best ] && STEP=  # STEP=best: the best checkpoint, also for a preset the paper evaluates at a fixed step
LAMBDA=${LAMBDA:-$PAPER_LAMBDA}
PAPER_ROW=${USER_ROW:-$PAPER_ROW}
WIKI18=${WIKI18:-data/wiki18}
EXP=${EXP:-${PRESET}_$(basename "$MODEL")}
CKPT_DIR=${CKPT_DIR:-checkpoints/search_r1_llds/$EXP}
STEPS_OUT=$CKPT_DIR/eval  # where python -m train.evaluate --checkpoints writes by default
if [ -n "$STEP" ]; then
  echo "reproducing '$PAPER_ROW': $MODEL, preset $PRESET, evaluated at step $STEP${LAMBDA:+, lambda $LAMBDA}"
else
  echo "reproducing '$PAPER_ROW': $MODEL, preset $PRESET, the best checkpoint before collapse (every saved"
  echo "  step is kept and evaluated on $DATA_DIR/val_sample.parquet; set STEP=<step> to evaluate one step)"
fi

[ -f "$DATA_DIR/train.parquet" ] && [ -f "$DATA_DIR/test.parquet" ] && [ -f "$DATA_DIR/val_sample.parquet" ] \
  || bash scripts/download_data.sh

base=${RETRIEVER_URL%/retrieve}
# What this script leaves running: a retriever it started is stopped when it ends (success or not),
# unless KEEP_RETRIEVER=1; one that was already running is left as it was. Either way it says so.
STARTED_PID=
finish() {
  local rc=$?
  if [ -n "$STARTED_PID" ] && kill -0 "$STARTED_PID" 2>/dev/null; then
    if [ "${KEEP_RETRIEVER:-0}" = 1 ]; then
      echo "left running: the e5 retriever this script started (pid $STARTED_PID, $base; its index shards hold" \
           "GPU memory on every GPU); stop it with: kill $STARTED_PID"
    else
      echo "stopping the e5 retriever this script started (pid $STARTED_PID; KEEP_RETRIEVER=1 keeps it up)"
      kill "$STARTED_PID" 2>/dev/null || true
    fi
  elif [ -z "$STARTED_PID" ]; then
    echo "left running: the retriever at $base, as it was before this script (not started here)"
  fi
  exit "$rc"
}
if "$PY" -m retrieval.client "$base"; then  # a retriever already answers: no wiki-18 download (~78 GB)
  echo "using the retriever at $base"
  trap finish EXIT
else
  [ -f "$WIKI18/e5_Flat.index" ] && [ -f "$WIKI18/wiki-18.jsonl" ] || bash scripts/download_wiki18.sh "$WIKI18" corpus,e5
  echo "starting the e5 retriever (log: runs/retriever.log) ..."
  mkdir -p runs
  RETRIEVER=e5 WIKI18=$WIKI18 nohup bash retrieval_launch.sh > runs/retriever.log 2>&1 &
  STARTED_PID=$!  # retrieval_launch.sh execs the server: this is its pid
  trap finish EXIT
  # loading 21M vectors takes minutes; stop waiting at once if the retriever process dies
  if ! "$PY" -m retrieval.client "$base" --wait 1800 --pid $!; then
    echo "error: the retriever did not come up; the end of runs/retriever.log:" >&2
    tail -n 20 runs/retriever.log >&2
    exit 1
  fi
fi

EXTRA=(trainer.experiment_name="$EXP" trainer.default_local_dir="$CKPT_DIR")
[ -n "$LAMBDA" ] && EXTRA+=("llds.lambda=$LAMBDA")
if [ -n "$STEP" ]; then
  # train unless global_step_$STEP is there and complete (a cut save is not: the run resumes and redoes it)
  if ! "$PY" -m train.checkpoints "$CKPT_DIR/global_step_$STEP" >/dev/null 2>&1; then
    (source scripts/_common.sh; run_preset "$PRESET" "${EXTRA[@]}" "checkpoints.keep_steps=[$STEP]" "$@")
  fi
else
  # the whole run, every checkpoint kept (checkpoints.keep_last=0; a 3B actor's step with its optimizer
  # state is ~36 GB), unless the best step was already chosen
  if [ ! -f "$STEPS_OUT/best.json" ]; then
    (source scripts/_common.sh; run_preset "$PRESET" "${EXTRA[@]}" checkpoints.keep_last=0 "$@")
    # shellcheck disable=SC2086
    "$PY" -m train.evaluate --checkpoints "$CKPT_DIR" --data "$DATA_DIR/val_sample.parquet" \
      --out "$STEPS_OUT" --retriever-url "$base" $(eval_backend) ${STEPS_ARGS:-}
  fi
  STEP=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["step"])' "$STEPS_OUT/best.json")
  echo "best step on the validation sample: $STEP ($STEPS_OUT/steps.jsonl, $STEPS_OUT/em_vs_step.png)"
fi

HF_DIR=$CKPT_DIR/global_step_$STEP/hf
if [ ! -f "$HF_DIR/config.json" ]; then
  "$PY" -m verl.model_merger merge --backend fsdp --local_dir "$CKPT_DIR/global_step_$STEP/actor" --target_dir "$HF_DIR"
fi

# EVAL_ARGS: more train.evaluate arguments, e.g. EVAL_ARGS="--limit 100" (100 questions per source)
# shellcheck disable=SC2086
bash scripts/evaluate.sh "$HF_DIR" --out "${EVAL_OUT:-runs/eval/$EXP-step$STEP.jsonl}" --paper-row "$PAPER_ROW" ${EVAL_ARGS:-}
