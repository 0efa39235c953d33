#!/usr/bin/env bash
# Start the retrieval server. With no arguments: builds (if missing) a MiniLM dense index over the
# bundled corpus (data/corpus.jsonl) and serves it on 127.0.0.1:8000.
#
#   bash retrieval_launch.sh                      # bundled corpus, dense MiniLM, CPU
#   RETRIEVER=bm25 bash retrieval_launch.sh       # bundled corpus, BM25 (bm25s)
#   RETRIEVER=e5 WIKI18=/data/wiki18 bash retrieval_launch.sh     # Search-R1's e5_Flat.index on all GPUs
#   RETRIEVER=e5-hnsw WIKI18=/data/wiki18 bash retrieval_launch.sh # HNSW64 index (CPU)
#   RETRIEVER=e5-ivfpq WIKI18=/data/wiki18 bash retrieval_launch.sh # IVF-PQ (built with retrieval.build) on GPUs, faiss-gpu
#   RETRIEVER=lucene WIKI18=/data/wiki18 bash retrieval_launch.sh  # prebuilt wiki-18 BM25 (the lucene extra)
#   RETRIEVER=lucene CORPUS=data/corpus.jsonl bash retrieval_launch.sh  # Lucene BM25 over a jsonl (built once)
#   HOST=0.0.0.0 PORT=8000 bash retrieval_launch.sh -- --max-batch 512   # multi-node: bind all interfaces
#   RERANK=cross-encoder/ms-marco-MiniLM-L12-v2 RETRIEVER=e5 ... # any kind: retrieve 10, rerank, return topk
# Extra arguments after the variables are passed to `python -m retrieval.server`.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/_python.sh
RETRIEVER=${RETRIEVER:-minilm}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
CORPUS_GIVEN=${CORPUS:+1}
CORPUS=${CORPUS:-data/corpus.jsonl}
INDEX_ROOT=${INDEX_ROOT:-runs/index}
WIKI18=${WIKI18:-data/wiki18}
[ "${1:-}" = "--" ] && shift
# RERANK=<cross-encoder>: Search-R1's reranking (retrieve --rerank-depth 10, score, return the best topk)
[ -n "${RERANK:-}" ] && set -- --rerank "$RERANK" "$@"

case "$RETRIEVER" in
  minilm|bm25)
    KIND=dense; [ "$RETRIEVER" = bm25 ] && KIND=bm25
    INDEX="$INDEX_ROOT/$RETRIEVER"
    if [ ! -f "$INDEX/manifest.json" ]; then
      echo "building the $RETRIEVER index over $CORPUS into $INDEX ..."
      "$PY" -m retrieval.build --corpus "$CORPUS" --out "$INDEX" --kind "$KIND"
    fi
    exec "$PY" -m retrieval.server --index "$INDEX" --host "$HOST" --port "$PORT" "$@" ;;
  e5)
    exec "$PY" -m retrieval.server --index "$WIKI18/e5_Flat.index" --corpus "$WIKI18/wiki-18.jsonl" \
      --encoder intfloat/e5-base-v2 --gpu --host "$HOST" --port "$PORT" "$@" ;;
  e5-hnsw)
    exec "$PY" -m retrieval.server --index "$WIKI18/e5_HNSW64.index" --corpus "$WIKI18/wiki-18.jsonl" \
      --encoder intfloat/e5-base-v2 --host "$HOST" --port "$PORT" "$@" ;;
  e5-ivfpq)  # INDEX_DIR: an index folder built by `python -m retrieval.build --factory IVF65536,PQ64 ...`
    INDEX=${INDEX_DIR:-$INDEX_ROOT/e5_ivfpq}
    if [ ! -f "$INDEX/manifest.json" ]; then
      echo "error: no IVF-PQ index in $INDEX; build it (docs/retrieval.md, An IVF-PQ index of wiki-18 for one GPU):" >&2
      echo "  python -m retrieval.build --corpus $WIKI18/wiki-18.jsonl --out $INDEX --encoder intfloat/e5-base-v2 --factory IVF65536,PQ64 --train-size 2621440" >&2
      exit 1
    fi
    exec "$PY" -m retrieval.server --index "$INDEX" --gpu --host "$HOST" --port "$PORT" "$@" ;;
  lucene)
    need_stack "RETRIEVER=lucene (the lucene extra)" pyserini
    if [ -n "$CORPUS_GIVEN" ]; then  # a Lucene index of that jsonl, built with pyserini's indexer
      INDEX="$INDEX_ROOT/lucene"
      if [ ! -f "$INDEX/manifest.json" ]; then
        echo "building the lucene index over $CORPUS into $INDEX ..."
        "$PY" -m retrieval.build --corpus "$CORPUS" --out "$INDEX" --kind lucene
      fi
      exec "$PY" -m retrieval.server --index "$INDEX" --host "$HOST" --port "$PORT" "$@"
    fi
    if ! ls "$WIKI18"/bm25/segments_* >/dev/null 2>&1; then
      echo "error: no Lucene index in $WIKI18/bm25 (no segments_* file); download it with:" >&2
      echo "  bash scripts/download_wiki18.sh $WIKI18 corpus,bm25" >&2
      echo "  (or index a jsonl: RETRIEVER=lucene CORPUS=data/corpus.jsonl bash retrieval_launch.sh)" >&2
      exit 1
    fi
    exec "$PY" -m retrieval.server --kind lucene --index "$WIKI18/bm25" --corpus "$WIKI18/wiki-18.jsonl" \
      --host "$HOST" --port "$PORT" "$@" ;;
  *) echo "unknown RETRIEVER=$RETRIEVER (minilm | bm25 | e5 | e5-hnsw | e5-ivfpq | lucene)" >&2; exit 2 ;;
esac
