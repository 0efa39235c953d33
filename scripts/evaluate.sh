#!/usr/bin/env bash
# Evaluate a checkpoint on the 7 benchmarks: bash scripts/evaluate.sh CKPT [extra train.evaluate args]
# (greedy, max_turns 4, top-3; needs the retriever up and data/processed/test.parquet; DATA_DIR,
# RETRIEVER_URL and BACKEND=vllm|hf from the environment).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
CKPT=${1:?usage: scripts/evaluate.sh CKPT [args]}; shift
check_retriever
# BACKEND=vllm (batched; the GPU install) or hf (transformers, any device, slow). Unset: vllm when the
# picked Python has it, else hf, saying so.
if [ -z "${BACKEND:-}" ]; then
  if "$PY" -c "import vllm" >/dev/null 2>&1; then BACKEND=vllm; else
    BACKEND=hf; echo "note: $PY has no vLLM: evaluating with BACKEND=hf (transformers; slow on 51,713 questions)" >&2; fi
fi
[ "$BACKEND" = vllm ] && need_stack "BACKEND=vllm (BACKEND=hf: transformers, any device)" vllm
exec "$PY" -m train.evaluate --model "$CKPT" --data "$DATA_DIR/test.parquet" --backend "$BACKEND" \
  --retriever-url "${RETRIEVER_URL%/retrieve}" "$@"
