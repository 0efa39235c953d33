#!/usr/bin/env bash
# `make demo`: the whole pipeline on the bundled data, offline, on CPU (about 10 minutes on 2 cores).
#   1. build the dense MiniLM index over data/corpus.jsonl and start the retrieval server
#   2. prepare the bundled QA as verl train/test parquet
#   3. build a tiny Qwen2 policy and warm-start it on the Search-R1 format
#   4. 3 GRPO steps with LLDS through verl's real trainer on CPU (Ray, our task runner, the
#      search_r1 agent loop calling the live retriever, our reward, our loss), 2 optimizer updates
#      per rollout batch; checkpoint; resume from it for 1 more step
#   5. merge the checkpoint, evaluate it on the test parquet, ask it one question with infer.py
# A tiny policy trained for 4 steps cannot answer questions: the demo shows every stage working.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
OUT=${DEMO_DIR:-runs/demo}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"
rm -rf "$OUT/checkpoints" "$OUT/hf" "$OUT/eval.jsonl"

echo "== 1. retrieval index + server (log: $OUT/retriever.log)"
if [ ! -f runs/index/minilm/manifest.json ]; then
  "$PY" -m retrieval.build --corpus data/corpus.jsonl --out runs/index/minilm
fi
if "$PY" -m retrieval.client "$URL"; then
  echo "error: something already answers on $URL; stop it or run PORT=<free port> make demo" >&2; exit 1
fi
"$PY" -m retrieval.server --index runs/index/minilm --port "$PORT" > "$OUT/retriever.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  "$PY" -m retrieval.client "$URL" && break
  kill -0 $SERVER 2>/dev/null || { echo "the retrieval server died:" >&2; tail -20 "$OUT/retriever.log" >&2; exit 1; }
  sleep 1
done
"$PY" - "$URL" <<'PYEOF'
import sys
from retrieval.client import RetrievalClient, contents_of
from train import protocol
q = "Who illustrated American Splendor?"
res = RetrievalClient(sys.argv[1]).retrieve([q], topk=3)
print(f"server up at {sys.argv[1]}; query: {q}")
print(protocol.format_observation(contents_of(res[0])).strip()[:600], "...")
PYEOF

echo "== 2. data"
"$PY" -m train.data_prep --out "$OUT/data" --local data/qa.jsonl --holdout 10

echo "== 3. tiny policy (format warm-start)"
"$PY" -m train.tiny "$OUT/tiny_model" --hidden-size 128 --heads 4 --sft-steps 600 2>&1 | grep -v "Writing model\|Loading weights"

echo "== 4. GRPO + LLDS with verl on CPU: 3 steps, then resume for 1 (logs: $OUT/train.log, $OUT/train_resume.log)"
TRAIN=(--config-name cpu_smoke actor_rollout_ref.model.path="$OUT/tiny_model"
       data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/test.parquet"
       trainer.default_local_dir="$OUT/checkpoints" search_r1.retriever_url="$URL/retrieve"
       search_r1.max_turn_tokens=96)
VERL_PLATFORM=cpu "$PY" -m train.main "${TRAIN[@]}" trainer.total_training_steps=3 trainer.save_freq=3 \
  > "$OUT/train.log" 2>&1 || { tail -40 "$OUT/train.log"; exit 1; }
VERL_PLATFORM=cpu "$PY" -m train.main "${TRAIN[@]}" trainer.total_training_steps=4 trainer.save_freq=4 \
  trainer.resume_mode=auto > "$OUT/train_resume.log" 2>&1 || { tail -40 "$OUT/train_resume.log"; exit 1; }
"$PY" scripts/step_metrics.py "$OUT/train.log" "$OUT/train_resume.log"

echo "== 5. evaluate the step-4 checkpoint, then ask it a question"
"$PY" -m verl.model_merger merge --backend fsdp --local_dir "$OUT/checkpoints/global_step_4/actor" \
  --target_dir "$OUT/hf" > "$OUT/merge.log" 2>&1 || { tail -20 "$OUT/merge.log"; exit 1; }
"$PY" -m train.evaluate --model "$OUT/hf" --data "$OUT/data/test.parquet" --retriever-url "$URL" \
  --max-new-tokens 96 --max-turns 2 --device cpu --out "$OUT/eval.jsonl" 2> "$OUT/eval.log"
"$PY" infer.py "Who illustrated American Splendor?" --model "$OUT/hf" --retriever-url "$URL" \
  --max-new-tokens 96 --max-turns 2 --device cpu 2>/dev/null
echo
echo "logs: $OUT/train.log, $OUT/train_resume.log, $OUT/retriever.log; checkpoints: $OUT/checkpoints;"
echo "merged model: $OUT/hf; per-question evaluation: $OUT/eval.jsonl"
