#!/usr/bin/env bash
# Start the retrieval server from a named preset (python -m retrieval.launch, where the presets live).
# With no arguments: builds (if missing) a MiniLM dense index over the bundled corpus (data/corpus.jsonl)
# and serves it on 127.0.0.1:8000.
#
#   bash retrieval_launch.sh                      # bundled corpus, dense MiniLM, CPU
#   RETRIEVER=bm25 bash retrieval_launch.sh       # bundled corpus, BM25 (bm25s)
#   RETRIEVER=e5 WIKI18=/data/wiki18 bash retrieval_launch.sh     # Search-R1's e5_Flat.index on all GPUs
#   RETRIEVER=e5-cpu WIKI18=/data/wiki18 bash retrieval_launch.sh  # e5_Flat.index, exact fp32, memory-mapped (CPU)
#   RETRIEVER=e5-hnsw WIKI18=/data/wiki18 bash retrieval_launch.sh # HNSW64 index (CPU)
#   RETRIEVER=e5-ivfpq WIKI18=/data/wiki18 bash retrieval_launch.sh # IVF-PQ (built with retrieval.build) on GPUs, faiss-gpu
#   RETRIEVER=lucene WIKI18=/data/wiki18 bash retrieval_launch.sh  # prebuilt wiki-18 BM25 (the lucene extra)
#   RETRIEVER=lucene CORPUS=data/corpus.jsonl bash retrieval_launch.sh  # Lucene BM25 over a jsonl (built once)
#   HOST=0.0.0.0 PORT=8000 bash retrieval_launch.sh -- --max-batch 512   # multi-node: bind all interfaces
#   RERANK=cross-encoder/ms-marco-MiniLM-L12-v2 RETRIEVER=e5 ... # any kind: retrieve 10, rerank, return topk
# Extra arguments after the variables are `python -m retrieval.server` flags, over the preset's settings.
# A missing index is built first by `python -m retrieval.build` in a child process; exit 2: the preset cannot run.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/_python.sh
[ "${1:-}" = "--" ] && shift
ARGS=("${RETRIEVER:-minilm}" --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}"
      --index-root "${INDEX_ROOT:-runs/index}" --wiki18 "${WIKI18:-data/wiki18}")
[ -n "${CORPUS:-}" ] && ARGS+=(--corpus "$CORPUS")
[ -n "${INDEX_DIR:-}" ] && ARGS+=(--index-dir "$INDEX_DIR")
[ -n "${RERANK:-}" ] && ARGS+=(--rerank "$RERANK")
exec "$PY" -m retrieval.launch "${ARGS[@]}" -- "$@"
