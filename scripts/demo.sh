#!/usr/bin/env bash
# `make demo`: the pipeline on the bundled data, offline, on CPU.
#   1. build the dense (MiniLM) index over data/corpus.jsonl and start the retrieval server
#   2. ask it a question over HTTP and print the passages
#   3. prepare the bundled QA as verl train/test parquet
#   4. build the tiny Qwen2 policy, ask it a question with infer.py (it searches through the server)
#   5. evaluate it on a few held-out questions (EM table)
# A tiny random policy cannot answer; the demo shows every stage working, not a trained model.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
OUT=${DEMO_DIR:-runs/demo}
PORT=${PORT:-8000}
URL=http://127.0.0.1:$PORT
mkdir -p "$OUT"

echo "== 1. retrieval index + server"
if [ ! -f runs/index/minilm/manifest.json ]; then
  "$PY" -m retrieval.build --corpus data/corpus.jsonl --out runs/index/minilm
fi
"$PY" -m retrieval.server --index runs/index/minilm --port "$PORT" > "$OUT/retriever.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  "$PY" -c "import httpx,sys; sys.exit(httpx.get('$URL/health', timeout=2).status_code != 200)" 2>/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "the retrieval server died; see $OUT/retriever.log" >&2; tail -20 "$OUT/retriever.log" >&2; exit 1; }
  sleep 1
done
echo "server up at $URL (log: $OUT/retriever.log)"

echo "== 2. one query"
"$PY" - "$URL" <<'PYEOF'
import sys
from retrieval.client import RetrievalClient, contents_of
from train import protocol
q = "Who illustrated American Splendor?"
res = RetrievalClient(sys.argv[1]).retrieve([q], topk=3)
print("query:", q)
print(protocol.format_observation(contents_of(res[0])).strip())
PYEOF

echo "== 3. data"
"$PY" -m train.data_prep --out "$OUT/data" --local data/qa.jsonl --holdout 10

echo "== 4. tiny policy + infer.py"
"$PY" -m train.tiny "$OUT/tiny_model" > /dev/null
"$PY" infer.py "Who illustrated American Splendor?" --model "$OUT/tiny_model" --retriever-url "$URL" \
  --max-new-tokens 24 --max-turns 2 --temperature 1.0 --device cpu

echo "== 5. evaluation (20 held-out questions)"
"$PY" -m train.evaluate --model "$OUT/tiny_model" --data "$OUT/data/test.parquet" --retriever-url "$URL" \
  --max-new-tokens 24 --device cpu --out "$OUT/eval.jsonl"
echo "demo outputs in $OUT"
