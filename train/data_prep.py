"""FlashRAG QA sets -> verl parquet (``train.parquet`` / ``test.parquet``) in Search-R1's layout.

    python -m train.data_prep --out data/processed                          # hub: NQ+HotpotQA train, 7 test sets
    python -m train.data_prep --out runs/data --local data/qa.jsonl --holdout 100   # bundled, offline

Rows: ``data_source``, ``prompt`` (chat messages from :mod:`train.protocol`), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": {"target": [...]}}``), ``extra_info``
(``split``, ``index`` within its source, ``uid`` unique across the merged file, ``id``,
``question``) and ``agent_name`` (``search_r1``). Search-R1 reused the per-source index as the
group id, so NQ row i and HotpotQA row i shared a GRPO group; here ``uid`` is globally unique
(verl 0.9.1 also draws its own GRPO group ids per prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional

from train import protocol
from train.agent_loop import AGENT_NAME
from train.reward import check_golds

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
TRAIN_SOURCES = ("nq", "hotpotqa")
TEST_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
TEST_SPLIT_ORDER = ("test", "dev", "train")  # per set, the first that exists (as Search-R1 did)


class DataError(ValueError):
    pass


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line; bad JSON names the file and line."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                f"convert the file, e.g. iconv -f latin1 -t utf-8") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}:{n}: expected a JSON object")
            yield n, rec


def check_record(rec: dict, where: str) -> tuple[str, list[str]]:
    q = rec.get("question")
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}: row has no question")
    try:
        golds = check_golds(rec.get("golden_answers"), where, field="golden_answers")
    except ValueError as e:
        raise DataError(str(e)) from None
    return q.strip(), golds


def make_row(rec: dict, source: str, split: str, index: int, uid: str) -> dict:
    question, golds = check_record(rec, f"{source}/{split}[{index}]")
    return {
        "data_source": source,
        "prompt": protocol.make_messages(question),
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"split": split, "index": index, "uid": uid, "id": str(rec.get("id", index)),
                       "question": question},
        "agent_name": AGENT_NAME,
    }


def dedupe(records: list[dict]) -> tuple[list[dict], int]:
    seen, out = set(), []
    for r in records:
        key = protocol.normalize_answer(r["question"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out, len(records) - len(out)


def sample(records: list, n: Optional[int], seed: int) -> list:
    if n is None or n >= len(records):
        return records
    idx = sorted(random.Random(seed).sample(range(len(records)), n))
    return [records[i] for i in idx]


def load_local(paths: Iterable[str]) -> dict[str, list[dict]]:
    """Local FlashRAG jsonl; the source is each row's ``dataset`` field, else the file name."""
    by_source: dict[str, list[dict]] = {}
    for path in paths:
        if not Path(path).is_file():
            raise DataError(f"file not found: {path}")
        for n, rec in read_jsonl(path):
            check_record(rec, f"{path}:{n}")
            by_source.setdefault(str(rec.get("dataset") or Path(path).stem), []).append(rec)
    return by_source


def load_hub(source: str, splits: Iterable[str]) -> tuple[str, list[dict]]:
    """First available split of a FlashRAG set (network; cached by datasets)."""
    from datasets import load_dataset

    errors = []
    for split in splits:
        try:
            ds = load_dataset(HUB_REPO, source, split=split)
        except Exception as e:  # missing split or offline
            errors.append(f"{split}: {type(e).__name__}")
            continue
        return split, [dict(r) for r in ds]
    raise DataError(f"{HUB_REPO}/{source}: none of the splits {list(splits)} could be loaded ({'; '.join(errors)})")


def build(sets: dict[str, tuple[str, list[dict]]], *, sample_n: Optional[int], seed: int,
          uid_prefix: str) -> tuple[list[dict], dict[str, int]]:
    rows, counts = [], {}
    for source, (split, records) in sets.items():
        records, dropped = dedupe(records)
        if dropped:
            print(f"  {source}/{split}: {dropped} duplicate questions removed")
        records = sample(records, sample_n, seed)
        for i, rec in enumerate(records):
            rows.append(make_row(rec, source, split, i, f"{uid_prefix}-{source}-{i}"))
        counts[source] = len(records)
    return rows, counts


def val_sample(test_rows: list[dict], per_source: int, seed: int) -> list[dict]:
    """A fixed stratified sample of the test rows: up to ``per_source`` per data_source, chosen by
    ``seed`` (the same rows every run, so validation curves are comparable across steps and runs)."""
    by_source: dict[str, list[dict]] = {}
    for r in test_rows:
        by_source.setdefault(r["data_source"], []).append(r)
    out = []
    for source in sorted(by_source):
        out += sample(by_source[source], per_source, seed)
    return out


def write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


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
    try:
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
    except DataError as e:
        raise SystemExit(f"error: {e}")
    write_parquet(train_rows, out / "train.parquet")
    if test_rows:
        write_parquet(test_rows, out / "test.parquet")
    print(f"train.parquet: {len(train_rows)} rows {dict(Counter(train_counts))}")
    print(f"test.parquet:  {len(test_rows)} rows {dict(Counter(test_counts))}")
    if test_rows and args.val_per_source:
        val_rows = val_sample(test_rows, args.val_per_source, args.seed)
        write_parquet(val_rows, out / "val_sample.parquet")
        print(f"val_sample.parquet: {len(val_rows)} rows {dict(Counter(r['data_source'] for r in val_rows))} "
              f"(validation during training; the full table: scripts/evaluate.sh)")


if __name__ == "__main__":
    main()
