#!/usr/bin/env bash
# Download wiki-18 (21,015,324 passages) and Search-R1's prebuilt indexes from the Hugging Face hub.
#   bash scripts/download_wiki18.sh [DEST=data/wiki18] [what: corpus,e5 (default) | bm25 | hnsw, comma-separated]
# e5 users need corpus,e5 (the default); RETRIEVER=lucene needs corpus,bm25; e5-hnsw needs corpus,hnsw.
# Each file is verified (size, line count) before its download leftovers are deleted: the split
# e5 parts (64.5 GB) once e5_Flat.index is assembled, the .gz once wiki-18.jsonl is unpacked.
# Disk: corpus 14 GB (+4.6 GB .gz while unpacking), e5 flat 64.6 GB (x2 while assembling).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-data/wiki18}
WHAT=${2:-corpus,e5}
source scripts/_python.sh
mkdir -p "$DEST"
dl() {  # repo, pattern, local dir (retrieval/hub.py)
  "$PY" -m retrieval.hub "$1" "$2" "$3"
}
size_ok() {  # file, min bytes
  local n; n=$(stat -c %s "$1" 2>/dev/null || echo 0)
  [ "$n" -ge "$2" ]
}
check_size() {
  if ! size_ok "$1" "$2"; then echo "error: $1 is $(stat -c %s "$1" 2>/dev/null || echo 0) bytes, expected at least $2" >&2; exit 1; fi
  echo "ok: $1 ($(stat -c %s "$1") bytes)"
}
for item in ${WHAT//,/ }; do
  case "$item" in
    corpus|e5|bm25|hnsw) ;;
    *) echo "error: unknown item '$item' (corpus, e5, bm25, hnsw)" >&2; exit 2 ;;
  esac
done
if [[ ,$WHAT, == *,corpus,* ]]; then
  if [ ! -f "$DEST/wiki-18.jsonl" ]; then
    dl PeterJinGo/wiki-18-corpus "wiki-18.jsonl.gz" "$DEST"
    gunzip -c "$DEST/wiki-18.jsonl.gz" > "$DEST/wiki-18.jsonl.part"
    mv "$DEST/wiki-18.jsonl.part" "$DEST/wiki-18.jsonl"
  fi
  check_size "$DEST/wiki-18.jsonl" 13000000000
  lines=$(wc -l < "$DEST/wiki-18.jsonl"); [ "$lines" -eq 21015324 ] || { echo "error: $lines passages, expected 21015324" >&2; exit 1; }
  rm -f "$DEST/wiki-18.jsonl.gz"   # verified: the archive is no longer needed
fi
if [[ ,$WHAT, == *,e5,* ]]; then
  FLAT_BYTES=$((21015324 * 768 * 4))
  if ! size_ok "$DEST/e5_Flat.index" $FLAT_BYTES; then
    dl PeterJinGo/wiki-18-e5-index "part_*" "$DEST"
    cat "$DEST"/part_aa "$DEST"/part_ab > "$DEST/e5_Flat.index.part"
    mv "$DEST/e5_Flat.index.part" "$DEST/e5_Flat.index"
  fi
  check_size "$DEST/e5_Flat.index" $FLAT_BYTES
  rm -f "$DEST"/part_aa "$DEST"/part_ab   # verified: the split parts are no longer needed
fi
if [[ ,$WHAT, == *,hnsw,* ]]; then
  dl PeterJinGo/wiki-18-e5-index-HNSW64 "*" "$DEST"
  ls "$DEST"/*HNSW64*.index >/dev/null 2>&1 || { echo "error: no *HNSW64*.index in $DEST" >&2; exit 1; }
fi
if [[ ,$WHAT, == *,bm25,* ]]; then
  # The hub repo keeps the Lucene index under bm25/, so it lands in $DEST/bm25, where
  # RETRIEVER=lucene serves it from.
  dl PeterJinGo/wiki-18-bm25-index "bm25/*" "$DEST"
  ls "$DEST"/bm25/segments_* >/dev/null 2>&1 || { echo "error: no Lucene segments_* file in $DEST/bm25" >&2; exit 1; }
fi
echo "wiki-18 assets in $DEST: $(ls "$DEST" | tr '\n' ' ')"
