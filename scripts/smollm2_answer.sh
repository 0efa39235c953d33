#!/usr/bin/env bash
# `make smollm2`: a real language model that searches and answers, in minutes on CPU. SmolLM2-135M-Instruct
# as released writes no <search>/<answer> tags; a short warm start teaches it the Search-R1 format on the
# training side of the recorded split, then infer.py asks it a held-out question and the answer is checked
# against the gold (exit 1 when it is wrong or the model did not search: an instrument, not a show).
#   1. the model, converted once (python -m train.get_model; nothing to do when it is)
#   2. the MiniLM index over the bundled Wikipedia sample (runs/index/minilm, shared with make demo)
#   3. the recorded split of the bundled questions (data/split.json): 500 training, 200 held-out
#   4. the warm start: STEPS steps of 4 trajectories of the training side (lr 1e-4, seed 0)
#   5. infer.py asks held-out question QID (greedy); scripts/heldout_answer.py checks the tags and the answer
# STEPS (default 20), QID (a held-out id of data/split.json) and OUT (default runs/smollm2_answer) change them;
# CHECK=tags passes on the protocol alone (a search, then an answer, right or wrong): CI's quick twin,
# `STEPS=5 CHECK=tags make smollm2`, whose warm start is too short to answer reliably.
# docs/real-model.md says how the question was chosen and how many held-out questions this model answers.
source "$(dirname "$0")/_group.sh"  # a TERM to this script stops its stages too
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
OUT=${OUT:-runs/smollm2_answer}
STEPS=${STEPS:-20}
QID=${QID:-nq_oracle_2533}
CHECK=${CHECK:-answer}
INDEX=runs/index/minilm
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 1 ] \
  || { echo "error: STEPS must be an integer >= 1, got '$STEPS'" >&2; exit 2; }
case "$CHECK" in answer) CHECK=check ;; tags) ;; *) echo "error: CHECK must be answer or tags, got '$CHECK'" >&2; exit 2 ;; esac
Q=$("$PY" scripts/heldout_answer.py question "$QID")  # refuses an id that is not held out
mkdir -p "$OUT"
START=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - START )) s]"; }

echo "== 1. SmolLM2-135M-Instruct (log: $OUT/get_model.log)"
"$PY" -m train.get_model smollm2-135m-instruct > "$OUT/get_model.log" 2>&1 || { tail -20 "$OUT/get_model.log"; exit 1; }
tail -1 "$OUT/get_model.log"

echo "== 2. the MiniLM index over the bundled Wikipedia sample ($INDEX) $(elapsed)"
if [ ! -f "$INDEX/manifest.json" ]; then
  "$PY" -m retrieval.build --corpus data/corpus.jsonl --out "$INDEX" > "$OUT/index.log" 2>&1 \
    || { tail -20 "$OUT/index.log"; exit 1; }
fi
echo "$INDEX"

echo "== 3. the recorded split: the warm start reads the training side only $(elapsed)"
"$PY" -m train.data_prep --out "$OUT/data" --local data/qa.jsonl --holdout 100 --val-per-source 0 \
  > "$OUT/data_prep.log" 2>&1 || { tail -20 "$OUT/data_prep.log"; exit 1; }
grep "rows" "$OUT/data_prep.log"

echo "== 4. the warm start: $STEPS steps of 4 trajectories (log: $OUT/warm_start.log) $(elapsed)"
rm -rf "$OUT/sft"
"$PY" -m train.warm_start --model smollm2-135m-instruct --data "$OUT/data/train.parquet" --index "$INDEX" \
  --out "$OUT/sft" --steps "$STEPS" --batch 4 --lr 1e-4 --obs-tokens 200 --seed 0 > "$OUT/warm_start.log" 2>&1 \
  || { tail -20 "$OUT/warm_start.log"; exit 1; }
grep -v "Loading weights" "$OUT/warm_start.log" | tail -4

echo "== 5. a held-out question ($QID), through infer.py $(elapsed)"
echo "python infer.py --model $OUT/sft --index $INDEX --max-turns 2 --max-new-tokens 128 \"$Q\""
"$PY" infer.py "$Q" --model "$OUT/sft" --index "$INDEX" --max-turns 2 --max-new-tokens 128 --device cpu \
  2> "$OUT/infer.log" | tee "$OUT/answer.txt" || { tail -20 "$OUT/infer.log"; exit 1; }
"$PY" scripts/heldout_answer.py "$CHECK" "$QID" "$OUT/answer.txt"
echo "done $(elapsed)"
