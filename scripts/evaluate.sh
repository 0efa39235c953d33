#!/usr/bin/env bash
# Evaluate a checkpoint on the 7 benchmarks: bash scripts/evaluate.sh CKPT [extra train.evaluate args]
# (greedy, max_turns 4, top-3, one engine per visible GPU; needs the retriever up and
# data/processed/test.parquet; DATA_DIR, RETRIEVER_URL and BACKEND=vllm|hf from the environment).
# Baselines: --method direct|cot|rag (e.g. bash scripts/evaluate.sh Qwen/Qwen2.5-3B-Instruct --method rag).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
CKPT=${1:?usage: scripts/evaluate.sh CKPT [args]}; shift
case " $* " in
  *" --method direct "*|*" --method cot "*|*" --method=direct "*|*" --method=cot "*) ;;  # no search, no retriever
  *) check_retriever ;;
esac
BACKEND_ARG=$(eval_backend)
# shellcheck disable=SC2086
exec "$PY" -m train.evaluate --model "$CKPT" --data "$DATA_DIR/test.parquet" $BACKEND_ARG \
  --retriever-url "${RETRIEVER_URL%/retrieve}" "$@"
