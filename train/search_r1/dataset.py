"""Dataset rows for the Search-R1 task: FlashRAG QA records (checked, deduplicated, sampled) -> verl
parquet rows in Search-R1's layout. The command, and the row layout it writes: :mod:`train.data_prep`.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Iterable, Iterator, Optional

from train.errors import DataError
from train.search_r1 import prompts, protocol
from train.search_r1.reward import check_golds

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
TRAIN_SOURCES = ("nq", "hotpotqa")
#: the 7 test sets, in the paper's order (its table's columns; the evaluator's report follows it)
TEST_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
TEST_SPLIT_ORDER = ("test", "dev", "train")  # per set, the first that exists (as Search-R1 did)


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
        "prompt": prompts.make_messages(question),
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"split": split, "index": index, "uid": uid, "id": str(rec.get("id", index)),
                       "question": question},
        "agent_name": protocol.AGENT_NAME,
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
