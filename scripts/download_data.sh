#!/usr/bin/env bash
# FlashRAG QA sets (RUC-NLPIR/FlashRAG_datasets) -> data/processed/{train,test}.parquet
# (train: NQ + HotpotQA; test: the 7 benchmarks, 51,713 rows) and val_sample.parquet (200 per
# test source: what training validates on). Extra args go to train.data_prep.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
exec "$PY" -m train.data_prep --out data/processed "$@"
