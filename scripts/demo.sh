#!/usr/bin/env bash
# `make demo`: the whole pipeline, offline, on CPU, on a task a tiny policy can learn in minutes
# (train/learnable.py: invented countries; "What is the capital of X?" is answerable only by searching
# and copying the capital from the retrieved passage). A learnability check of the pipeline, not the
# paper's task. About 9 minutes on a 2-core Intel Xeon, 13 on an AMD EPYC (docs/cpu.md):
#   1. the task (corpus, questions, parquet) and a deliberately imperfect warm start of a tiny Qwen2
#      (it searches and copies, but answers the largest city instead of the capital most of the time)
#   2. a BM25 index of the task's corpus and the retrieval server
#   3. held-out EM of the warm start (greedy; the questions no stage trains on)
#   4. GRPO + LLDS with verl's trainer on CPU (2 ranks, reference model + KL, the search_r1 agent loop
#      calling the live retriever, the EM reward, the LLDS loss, the collapse alarm): reward per step
#   5. checkpoint, resume from it for 1 more step, merge, held-out EM after training, infer.py
#   6. plots of the run (python -m train.plot)
#   7. the dense (MiniLM) retriever over the bundled Wikipedia sample, queried once
#   8. a real language model (SmolLM2-135M-Instruct, converted by `make models`) asked a held-out question
#   9. the checks (python -m train.demo check): reward rose, held-out EM rose, the run resumed, the plots
#      exist, the collapse warning raised no alarm; the demo exits 1 naming any that failed
# STEPS=N changes the number of training steps (default 30); DEMO_DIR the output folder.
source "$(dirname "$0")/_group.sh"  # a TERM to this script stops its stages too
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
OUT=${DEMO_DIR:-runs/demo}
STEPS=${STEPS:-30}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 6 ] \
  || { echo "error: STEPS must be an integer >= 6 (the reward table compares the first and last 3 steps), got '$STEPS'" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: the trainer's workers write the metrics file
TASK=$OUT/task RUN=$OUT/learn
rm -rf "$RUN" "$OUT/hf"
mkdir -p "$RUN"
START=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - START )) s]"; }

echo "== 1. the learnable task and the warm start ($TASK)"
"$PY" -m train.learnable "$TASK" 2>&1 | grep -v "Writing model\|Loading weights"  # reuses an identical build
elapsed

echo "== 2. BM25 index + retrieval server (log: $OUT/retriever.log)"
"$PY" -m retrieval.build --corpus "$TASK/corpus.jsonl" --out "$TASK/bm25" --kind bm25 > "$OUT/index.log" 2>&1 \
  || { tail -20 "$OUT/index.log"; exit 1; }
if "$PY" -m retrieval.client "$URL"; then
  echo "error: something already answers on $URL; stop it or run PORT=<free port> make demo" >&2; exit 1
fi
"$PY" -m retrieval.server --index "$TASK/bm25" --port "$PORT" > "$OUT/retriever.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  "$PY" -m retrieval.client "$URL" && break
  kill -0 $SERVER 2>/dev/null || { echo "the retrieval server died:" >&2; tail -20 "$OUT/retriever.log" >&2; exit 1; }
  sleep 1
done
echo "server up at $URL"

EVAL=(--data "$TASK/data/test.parquet" --retriever-url "$URL" --max-turns 1 --topk 1 --max-new-tokens 48 --device cpu)
echo "== 3. held-out EM of the warm start (greedy, $(elapsed))"
rm -f "$OUT/eval_before.jsonl" "$OUT/eval_after.jsonl"
"$PY" -m train.evaluate --model "$TASK/model" "${EVAL[@]}" --out "$OUT/eval_before.jsonl" 2> "$OUT/eval_before.log" | tail -3

echo "== 4. GRPO + LLDS with verl on CPU: $STEPS steps (log: $RUN/train.log, metrics: $RUN/metrics.jsonl) $(elapsed)"
TRAIN=(--config-name cpu_learn actor_rollout_ref.model.path="$TASK/model"
       data.train_files="$TASK/data/train.parquet" data.val_files="$TASK/data/test.parquet"
       trainer.default_local_dir="$RUN/checkpoints" search_r1.retriever_url="$URL/retrieve")
# one line per step as it is trained (the whole log: $RUN/train.log)
VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$RUN/metrics.jsonl" "$PY" -m train.main "${TRAIN[@]}" \
  trainer.total_training_steps="$STEPS" trainer.save_freq="$STEPS" 2>&1 | tee "$RUN/train.log" \
  | "$PY" scripts/step_metrics.py --live --steps "$STEPS" || { tail -40 "$RUN/train.log"; exit 1; }
n=$(grep -c "collapse warning: " "$RUN/train.log" || true)  # the trainer's line for a step at WATCH or ALARM
if [ "$n" = 0 ]; then echo "collapse warning: quiet (no WATCH or ALARM in $STEPS steps)"
else echo "collapse warning: $n step(s) at WATCH or ALARM (their lines are above; check 9 fails on an ALARM)"; fi
"$PY" scripts/step_metrics.py "$RUN/train.log"

echo "== 5. resume from the step-$STEPS checkpoint for 1 step, merge, evaluate, ask $(elapsed)"
# the same metrics file: the resumed run keeps steps 1-$STEPS and appends (train/trainer/metrics_file.py)
VERL_PLATFORM=cpu VERL_FILE_LOGGER_PATH="$RUN/metrics.jsonl" "$PY" -m train.main "${TRAIN[@]}" \
  trainer.total_training_steps=$((STEPS + 1)) trainer.save_freq=$((STEPS + 1)) trainer.resume_mode=auto \
  trainer.val_before_train=false > "$RUN/train_resume.log" 2>&1 || { tail -40 "$RUN/train_resume.log"; exit 1; }
grep -q "step:$((STEPS + 1)) - " "$RUN/train_resume.log" \
  || { echo "error: the resumed run logged no step $((STEPS + 1)) (log: $RUN/train_resume.log)" >&2; exit 1; }
echo "resumed at step $STEPS and trained step $((STEPS + 1)) (log: $RUN/train_resume.log)"
"$PY" -m verl.model_merger merge --backend fsdp --local_dir "$RUN/checkpoints/global_step_$((STEPS + 1))/actor" \
  --target_dir "$OUT/hf" > "$OUT/merge.log" 2>&1 || { tail -20 "$OUT/merge.log"; exit 1; }
"$PY" -m train.evaluate --model "$OUT/hf" "${EVAL[@]}" --out "$OUT/eval_after.jsonl" 2> "$OUT/eval_after.log" > /dev/null
"$PY" -m train.demo compare "$OUT/eval_before.jsonl" "$OUT/eval_after.jsonl"
Q=$("$PY" -m train.demo question "$OUT/eval_after.jsonl")
echo "infer.py \"$Q\":"
"$PY" infer.py "$Q" --model "$OUT/hf" --retriever-url "$URL" --max-new-tokens 48 --max-turns 1 --topk 1 --device cpu \
  2> "$OUT/infer.log" || { tail -20 "$OUT/infer.log"; exit 1; }

echo "== 6. plots $(elapsed)"
"$PY" -m train.plot "$RUN"

echo "== 7. the dense retriever of the real runs, on the bundled Wikipedia sample $(elapsed)"
if [ ! -f runs/index/minilm/manifest.json ]; then
  "$PY" -m retrieval.build --corpus data/corpus.jsonl --out runs/index/minilm > "$OUT/index_dense.log" 2>&1 \
    || { tail -20 "$OUT/index_dense.log"; exit 1; }
fi
"$PY" -m train.demo dense runs/index/minilm

echo "== 8. a real language model: SmolLM2-135M-Instruct, as released, on a held-out question $(elapsed)"
Q=$("$PY" -m train.demo test-question)
echo "infer.py --model smollm2-135m-instruct \"$Q\":"
"$PY" infer.py "$Q" --model smollm2-135m-instruct --index runs/index/minilm --max-turns 1 --max-new-tokens 64 \
  --device cpu 2> "$OUT/infer_smollm2.log" || { tail -20 "$OUT/infer_smollm2.log"; exit 1; }
echo "(as released, it seldom writes the protocol's tags; make smollm2 teaches it in minutes: docs/real-model.md)"

echo "== 9. the demo's checks $(elapsed)"
"$PY" -m train.demo check "$OUT" --steps "$STEPS"
echo "logs: $RUN/train.log, $RUN/train_resume.log, $OUT/retriever.log; metrics: $RUN/metrics.jsonl;"
echo "checkpoints: $RUN/checkpoints; merged model: $OUT/hf; per-question evaluation: $OUT/eval_{before,after}.jsonl"
echo "done $(elapsed)"
