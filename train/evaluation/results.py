"""The evaluator's per-sample results file and the rows it asks: reading a test parquet, the rows an
interrupted run already wrote (resumable), EM per source."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Optional

from train.errors import DataError
from train.evaluation.report import ORDER
from train.search_r1 import protocol


def load_rows(path: str, sources: Optional[list[str]], limit: Optional[int]) -> list[dict]:
    import pandas as pd

    if not Path(path).is_file():
        raise DataError(f"--data not found: {path}")
    df = pd.read_parquet(path)
    missing = {"data_source", "prompt", "reward_model", "extra_info"} - set(df.columns)
    if missing:
        raise DataError(f"{path} lacks columns {sorted(missing)} (make it with `python -m train.data_prep`)")
    rows = []
    per_source: dict[str, int] = defaultdict(int)
    for i, r in enumerate(df.itertuples(index=False)):
        if sources and r.data_source not in sources:
            continue
        if limit is not None and per_source[r.data_source] >= limit:
            continue
        per_source[r.data_source] += 1
        info = dict(r.extra_info)
        question = info.get("question") or protocol.question_from_prompt(r.prompt)
        rows.append({"uid": str(info.get("uid", f"{r.data_source}-{i}")), "data_source": r.data_source,
                     "question": question, "golds": list(r.reward_model["ground_truth"]["target"])})
    return rows



def saw_failed_search(d: dict) -> bool:
    """A stored row whose trajectory got the failure observation (older files have no count)."""
    return int(d.get("failed_searches") or 0) > 0 or protocol.SEARCH_FAILED_TEXT in str(d.get("trajectory", ""))


def read_done(path: Path) -> dict[str, dict]:
    """Rows already evaluated. A row cut by an interruption, and a row that saw a failed search
    (written by an older version), are not results: both are redone."""
    done, redo = {}, 0
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by an interruption is redone
                if saw_failed_search(d):
                    redo += 1
                    continue
                done[d["uid"]] = d
    if redo:
        print(f"{path}: {redo} rows saw a failed search; they are redone")
    return done


def by_source(results: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by data_source, in the paper's order (others after, sorted)."""
    by = defaultdict(list)
    for d in results:
        by[d["data_source"]].append(d)
    return {s: by[s] for s in [s for s in ORDER if s in by] + sorted(s for s in by if s not in ORDER)}


def macro_em(results: list[dict]) -> tuple[dict[str, float], float]:
    """EM per source and their mean (the paper's average)."""
    per = {s: sum(d["em"] for d in rows) / len(rows) for s, rows in by_source(results).items()}
    return per, (sum(per.values()) / len(per) if per else 0.0)

