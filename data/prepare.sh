#!/usr/bin/env bash
# Prepare verl parquet files. With no arguments: the FlashRAG sets from the hub (Search-R1's
# train = NQ + HotpotQA, test = the 7 benchmarks) into data/processed/.
# Any arguments are passed to `python -m train.data_prep` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ $# -eq 0 ]; then set -- --out data/processed; fi
exec "$PY" -m train.data_prep "$@"
