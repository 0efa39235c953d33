"""The evaluator's per-sample results file and the rows it asks: reading a test parquet, the rows an
interrupted run already wrote (resumable), EM per source."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Optional

from train.errors import DataError
from train.evaluation.report import by_source
from train.inference.results_file import ResultsFile
from train.search_r1 import prompts


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
        question = info.get("question") or prompts.question_from_prompt(r.prompt)
        rows.append({"uid": str(info.get("uid", f"{r.data_source}-{i}")), "data_source": r.data_source,
                     "question": question, "golds": list(r.reward_model["ground_truth"]["target"])})
    return rows



def read_done(path: Path) -> dict[str, dict]:
    """Rows already evaluated, by uid (:meth:`train.inference.results_file.ResultsFile.read`: a row cut by
    an interruption, and a row that saw a failed search, are not results: both are redone)."""
    return ResultsFile.read(path, "uid")


def macro_em(results: list[dict]) -> tuple[dict[str, float], float]:
    """EM per source and their mean (the paper's average)."""
    per = {s: sum(d["em"] for d in rows) / len(rows) for s, rows in by_source(results).items()}
    return per, (sum(per.values()) / len(per) if per else 0.0)

