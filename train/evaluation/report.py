"""The evaluator's report: the EM table beside the paper's row, and the speed line."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Optional

from train.errors import UserError
from train.search_r1.dataset import TEST_SOURCES

#: the paper's EM table (arXiv 2512.04220 v2; PPO/GRPO rows quoted there from Search-R1), with sources
PAPER_RESULTS = Path(__file__).resolve().parent / "paper_results.json"
TEST_QUESTIONS = 51_713  # the 7 test sets of data/processed/test.parquet


def by_source(results: list[dict]) -> dict[str, list[dict]]:
    """Rows grouped by data_source, in the paper's order (its table's columns: the test sets as
    :mod:`train.data_prep` writes them), others after, sorted."""
    by = defaultdict(list)
    for d in results:
        by[d["data_source"]].append(d)
    return {s: by[s] for s in [s for s in TEST_SOURCES if s in by] + sorted(s for s in by if s not in TEST_SOURCES)}


def table(results: list[dict], paper: Optional[dict] = None) -> str:
    by = by_source(results)
    sources = list(by)
    lines = [f"{'source':<18}{'n':>7}{'EM':>8}{'F1':>8}" + (f"{'paper EM':>10}" if paper else "")]
    ems = []
    for s in sources:
        em = sum(d["em"] for d in by[s]) / len(by[s])
        f1 = sum(d["f1"] for d in by[s]) / len(by[s])
        ems.append(em)
        ref = f"{paper[s]:>10.3f}" if paper and s in paper else (f"{'':>10}" if paper else "")
        lines.append(f"{s:<18}{len(by[s]):>7}{em:>8.3f}{f1:>8.3f}{ref}")
    if ems:
        avg_ref = ""
        if paper:  # the paper's average only beside an average over the same sources
            theirs = [s for s in paper if s != "avg"]
            if set(theirs) <= set(sources) and "avg" in paper:
                avg_ref = f"{paper['avg']:>10.3f}"
            elif all(s in paper for s in sources):
                avg_ref = f"{sum(paper[s] for s in sources) / len(sources):>10.3f}"
        lines.append(f"{'average (macro)':<18}{len(results):>7}{sum(ems) / len(ems):>8.3f}{'':>8}{avg_ref}")
        if paper and len(sources) < len([s for s in paper if s != "avg"]):
            lines.append(f"(over {len(sources)} of the paper's {len([s for s in paper if s != 'avg'])} sources: the "
                         f"paper column's average is its mean over these {len(sources)}, not its reported average)")
    return "\n".join(lines)


def paper_row(name: Optional[str]) -> Optional[dict]:
    if not name:
        return None
    data = json.loads(PAPER_RESULTS.read_text())
    rows = data["rows"]
    if name not in rows:
        raise UserError(f"--paper-row {name!r} unknown; choose from: {', '.join(rows)}")
    print(f"paper row {name!r}: {data.get('row_sources', {}).get(name, data['source'])}")
    return rows[name]


def describe_speed(stats: dict) -> str:
    n, wall, tok = stats.get("asked", 0), stats.get("wall_s", 0.0), stats.get("generated_tokens", 0)
    if not n or wall <= 0:
        return "nothing left to ask (every row was already in the results file)"
    text = (f"{n} questions in {wall:.1f} s on {stats['engines']} engine{'s' if stats['engines'] > 1 else ''}: "
            f"{n / wall:.2f} questions/s, {tok / wall:.1f} generated tokens/s")
    if stats.get("reasked"):
        text += f" ({stats['reasked']} asked again after their engine died)"
    if stats.get("gpus"):  # the cost of the whole test set at this rate (an estimate: rates vary by source)
        text += (f"; at this rate the {TEST_QUESTIONS:,} test questions take "
                 f"{stats['gpus'] * wall / n * TEST_QUESTIONS / 3600:.2f} GPU-hours")
    return text

