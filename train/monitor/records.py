"""A run's per-step record: the metrics the collapse warning and its label read, and the corpus reader.

A corpus is a folder of ``*.jsonl`` files, one per run: a header ``{"run": {...}}`` (model, variant,
seed, steps, overrides, fault, crashed) and then ``{"step": N, <key>: value, ...}`` per training step
(``bench/collapse_corpus.py`` writes them; docs/training.md#collapse-warning).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from train.errors import DataError

#: metrics a record keeps (exact keys), and prefixes of which it keeps every key
KEEP = ("critic/score/mean", "actor/grad_norm", "actor/ppo_kl", "actor/pg_loss", "actor/loss", "actor/entropy",
        "actor/kl_loss", "actor/pg_clipfrac", "actor/lr", "response_length/mean", "response_length/clip_ratio",
        "timing_s/step", "timing_s/probe", "search_r1/lld_alarm")
KEEP_PREFIXES = ("actor/llds/", "actor/drift/", "search_r1/", "probe/")


def keep(metrics: dict) -> dict:
    """The kept keys of one step's metrics, floats (NaN stays NaN, written as JSON NaN)."""
    out = {}
    for k, v in metrics.items():
        if k in KEEP or k.startswith(KEEP_PREFIXES):
            try:
                out[k] = float(v)
            except (TypeError, ValueError):
                continue
    return out


@dataclass
class Run:
    name: str
    header: dict
    steps: list[dict] = field(default_factory=list)  # one dict per training step, in order; "step" included

    @property
    def fault(self) -> bool:
        return bool(self.header.get("fault"))

    def series(self, key: str) -> list[float]:
        return [_num(s.get(key)) for s in self.steps]


def _num(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def read_run(path: Path) -> Run:
    """One run's file; a clear error naming the file and line on a bad one."""
    header, steps = None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
            if "run" in row:
                header = row["run"]
            elif "step" in row:
                steps.append(row)
            else:
                raise DataError(f"{path}:{n}: neither a header ('run') nor a step row ('step')")
    if header is None:
        raise DataError(f"{path}: no header line ({{\"run\": {{...}}}})")
    steps.sort(key=lambda r: r["step"])
    return Run(path.stem if not header.get("model") else f"{header['model']}/{path.stem}", header, steps)


def read_corpus(root: Path) -> list[Run]:
    """Every run under ``root`` (recursively), sorted by name."""
    root = Path(root)
    if root.is_file():
        return [read_run(root)]
    if not root.is_dir():
        raise DataError(f"no corpus at {root}")
    runs = [read_run(p) for p in sorted(root.rglob("*.jsonl"))]
    if not runs:
        raise DataError(f"no run files (*.jsonl) under {root}")
    return sorted(runs, key=lambda r: r.name)
