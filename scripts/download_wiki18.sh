#!/usr/bin/env bash
# Download wiki-18 (21,015,324 passages) and Search-R1's prebuilt indexes from the Hugging Face hub.
#   bash scripts/download_wiki18.sh [DEST=data/wiki18] [what: corpus,e5,bm25,hnsw]
# Sizes are checked after download (the flat e5 index is ~64.6 GB: 21,015,324 x 768 x 4 bytes + header).
set -euo pipefail
DEST=${1:-data/wiki18}
WHAT=${2:-corpus,e5,bm25}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"
dl() {  # repo, pattern
  "$PY" - "$1" "$2" "$DEST" <<'PYEOF'
import sys
from huggingface_hub import snapshot_download
repo, pattern, dest = sys.argv[1:]
snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=[pattern], local_dir=dest)
PYEOF
}
check_size() {  # file, min bytes
  local n; n=$(stat -c %s "$1" 2>/dev/null || echo 0)
  if [ "$n" -lt "$2" ]; then echo "error: $1 is $n bytes, expected at least $2" >&2; exit 1; fi
  echo "ok: $1 ($n bytes)"
}
if [[ $WHAT == *corpus* ]]; then
  dl PeterJinGo/wiki-18-corpus "wiki-18.jsonl.gz"
  [ -f "$DEST/wiki-18.jsonl" ] || gunzip -k "$DEST/wiki-18.jsonl.gz"
  check_size "$DEST/wiki-18.jsonl" 13000000000
  lines=$(wc -l < "$DEST/wiki-18.jsonl"); [ "$lines" -eq 21015324 ] || { echo "error: $lines passages, expected 21015324" >&2; exit 1; }
fi
if [[ $WHAT == *e5* ]]; then
  dl PeterJinGo/wiki-18-e5-index "part_*"
  [ -f "$DEST/e5_Flat.index" ] || cat "$DEST"/part_aa "$DEST"/part_ab > "$DEST/e5_Flat.index"
  check_size "$DEST/e5_Flat.index" $((21015324 * 768 * 4))
fi
if [[ $WHAT == *hnsw* ]]; then
  dl PeterJinGo/wiki-18-e5-index-HNSW64 "*"
  ls "$DEST"/*HNSW64*.index >/dev/null 2>&1 || echo "warning: no *HNSW64*.index in $DEST" >&2
fi
if [[ $WHAT == *bm25* ]]; then
  DEST_SAVE=$DEST; DEST="$DEST/bm25"; mkdir -p "$DEST"
  dl PeterJinGo/wiki-18-bm25-index "*"
  DEST=$DEST_SAVE
  ls "$DEST"/bm25/segments_* "$DEST"/bm25/*/segments_* >/dev/null 2>&1 || echo "warning: no Lucene segments_* file found under $DEST/bm25; point --index at the directory that holds it" >&2
fi
echo "wiki-18 assets in $DEST"
