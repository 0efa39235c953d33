#!/usr/bin/env bash
# Evaluate a checkpoint on the 7 benchmarks: bash scripts/evaluate.sh CKPT [extra train.evaluate args]
# CKPT: a training checkpoint (a run's trainer.default_local_dir/global_step_N, merged once into
# global_step_N/hf), a Hugging Face model folder, a hub id, or a name of `python -m train.get_model --list`.
# (greedy, max_turns 4, top-3, one engine per visible GPU; needs the retriever up and
# data/processed/test.parquet; DATA_DIR, RETRIEVER_URL and BACKEND=vllm|hf from the environment).
# --paper-row expects the retriever to serve wiki-18 (--expect-corpus any: another corpus, deliberately;
# REHEARSAL=cpu passes it: the rehearsal searches the bundled sample).
# Baselines: --method direct|cot|rag (e.g. bash scripts/evaluate.sh Qwen/Qwen2.5-3B-Instruct --method rag).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_common.sh
CKPT=${1:?usage: scripts/evaluate.sh CKPT [args] (CKPT: a checkpoint global_step_N, a model folder or a hub id)}; shift
case " $* " in
  *" --method direct "*|*" --method cot "*|*" --method=direct "*|*" --method=cot "*) ;;  # no search, no retriever
  *) check_retriever ;;
esac
BACKEND_ARG=$(eval_backend)
case " $* " in
  *" --expect-corpus"*) ;;
  *) if [ -n "$REHEARSAL" ]; then set -- "$@" --expect-corpus any; fi ;;
esac
# shellcheck disable=SC2086
exec "$PY" -m train.evaluate --model "$CKPT" --data "$DATA_DIR/test.parquet" $BACKEND_ARG \
  --retriever-url "${RETRIEVER_URL%/retrieve}" "$@"
