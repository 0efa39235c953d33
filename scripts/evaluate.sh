#!/usr/bin/env bash
# Evaluate a checkpoint on the 7 benchmarks: bash scripts/evaluate.sh CKPT [extra train.evaluate args]
# (greedy, max_turns 4, top-3; needs the retriever up and data/processed/test.parquet).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
CKPT=${1:?usage: scripts/evaluate.sh CKPT [args]}; shift
check_retriever
BACKEND=${BACKEND:-vllm}
[ "$BACKEND" = vllm ] && need_stack "BACKEND=vllm (BACKEND=hf: transformers, any device)" vllm
exec "$PY" -m train.evaluate --model "$CKPT" --data "$DATA_DIR/test.parquet" --backend "$BACKEND" \
  --retriever-url "${RETRIEVER_URL%/retrieve}" "$@"
