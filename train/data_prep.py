"""python -m train.data_prep: FlashRAG QA sets -> verl parquet (``train.parquet`` / ``test.parquet``) in Search-R1's
layout.

    python -m train.data_prep --out data/processed                          # hub: NQ+HotpotQA train, 7 test sets
    python -m train.data_prep --out runs/data --local data/qa.jsonl --holdout 100   # bundled, offline

Rows: ``data_source``, ``prompt`` (chat messages from :mod:`train.search_r1.protocol`), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": {"target": [...]}}``), ``extra_info``
(``split``, ``index`` within its source, ``uid`` unique across the merged file, ``id``,
``question``) and ``agent_name`` (``search_r1``). Search-R1 reused the per-source index as the
group id, so NQ row i and HotpotQA row i shared a GRPO group; here ``uid`` is globally unique
(verl 0.9.1 also draws its own GRPO group ids per prompt).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from train.errors import DataError, exit_on_error
from train.files import atomic_write
from train.search_r1.dataset import (
    HUB_REPO,
    TEST_SOURCES,
    TEST_SPLIT_ORDER,
    TRAIN_SOURCES,
    build,
    dedupe,
    load_hub,
    load_local,
    val_sample,
    write_parquet,
)


@exit_on_error
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m train.data_prep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory for train.parquet / test.parquet")
    ap.add_argument("--train-sources", default=",".join(TRAIN_SOURCES))
    ap.add_argument("--test-sources", default=",".join(TEST_SOURCES))
    ap.add_argument("--local", nargs="+", default=None, help="local FlashRAG jsonl file(s) instead of the hub")
    ap.add_argument("--holdout", type=int, default=0, help="with --local: rows per source held out as test")
    ap.add_argument("--train-sample", type=int, default=None)
    ap.add_argument("--test-sample", type=int, default=None)
    ap.add_argument("--val-per-source", type=int, default=200,
                    help="rows per test source in val_sample.parquet, the fixed stratified sample that "
                         "training validates on (default 200; 0 = no file)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--template", choices=["base", "instruct"], default="base",
                    help="both use the Search-R1 text; verl applies the model's chat template when it has one")
    args = ap.parse_args(argv)
    for name in ("holdout", "train_sample", "test_sample", "val_per_source"):
        v = getattr(args, name)
        if v is not None and v < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    out = Path(args.out)
    if args.local:
        by_source = load_local(args.local)
        train_sets, test_sets = {}, {}
        for source, recs in by_source.items():
            recs, dropped = dedupe(recs)  # before the holdout split, so no question is in both
            if dropped:
                print(f"  {source}: {dropped} duplicate questions removed")
            shuffled = list(recs)
            random.Random(args.seed).shuffle(shuffled)
            test_sets[source] = ("test", shuffled[: args.holdout])
            train_sets[source] = ("train", shuffled[args.holdout:])
        test_sets = {k: v for k, v in test_sets.items() if v[1]}
    else:
        train_sets = {s: ("train", load_hub(s, ["train"])[1]) for s in args.train_sources.split(",") if s}
        test_sets = {s: load_hub(s, TEST_SPLIT_ORDER) for s in args.test_sources.split(",") if s}
    train_rows, train_counts = build(train_sets, sample_n=args.train_sample, seed=args.seed, uid_prefix="train")
    test_rows, test_counts = build(test_sets, sample_n=args.test_sample, seed=args.seed, uid_prefix="test")
    if not train_rows and not test_rows:
        where = ", ".join(args.local) if args.local else f"{HUB_REPO} ({args.train_sources}; {args.test_sources})"
        raise DataError(f"no rows: {where} holds no question/answer records")
    if not train_rows:
        raise DataError(f"no training rows: all {len(test_rows)} rows went to the test split (--holdout "
                        f"{args.holdout} per source)")
    write_parquet(train_rows, out / "train.parquet")
    if test_rows:
        write_parquet(test_rows, out / "test.parquet")
    split = {"command": "python -m train.data_prep " + " ".join(argv if argv is not None else sys.argv[1:]),
             "test": sorted(r["extra_info"]["id"] for r in test_rows),
             "train": sorted(r["extra_info"]["id"] for r in train_rows)}
    atomic_write(out / "split.json", json.dumps(split, indent=0) + "\n")  # which question went where
    print(f"train.parquet: {len(train_rows)} rows {dict(Counter(train_counts))}")
    print(f"test.parquet:  {len(test_rows)} rows {dict(Counter(test_counts))}")
    if test_rows and args.val_per_source:
        val_rows = val_sample(test_rows, args.val_per_source, args.seed)
        write_parquet(val_rows, out / "val_sample.parquet")
        print(f"val_sample.parquet: {len(val_rows)} rows {dict(Counter(r['data_source'] for r in val_rows))} "
              f"(validation during training; the full table: scripts/evaluate.sh)")


if __name__ == "__main__":
    sys.exit(main())
