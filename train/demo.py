"""python -m train.demo: the steps of `make demo` (scripts/demo.sh) that read its results.

    python -m train.demo compare BEFORE.jsonl AFTER.jsonl   # held-out EM before -> after RL, a few questions
    python -m train.demo question EVAL.jsonl                # the first question of an evaluation file
    python -m train.demo test-question                      # the first NQ question of the test split (data/split.json)
    python -m train.demo dense INDEX [--query Q]            # one search of a dense index, as the policy reads it
    python -m train.demo check DEMO_DIR --steps N           # the demo's pass criteria; exit 1 naming what failed

``check`` reads what the demo wrote in DEMO_DIR (``learn/metrics.jsonl``, ``learn/plots/``,
``eval_before.jsonl``, ``eval_after.jsonl``) and passes when the reward rose, held-out EM rose, the run
resumed, the plots exist and the collapse warning raised no alarm (train/toy/demo_checks.py says by how much).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from train.errors import DataError, exit_on_error

DENSE_QUERY = "Who illustrated American Splendor?"


def read_eval(path: Path) -> dict[str, dict]:
    """``{uid: row}`` of a ``train.evaluate --out`` file; a missing or empty file is an error naming it."""
    from train.evaluation.results import read_done

    if not path.is_file():
        raise DataError(f"no evaluation file at {path} (written by python -m train.evaluate --out)")
    rows = read_done(path)
    if not rows:
        raise DataError(f"{path} holds no evaluated question")
    return rows


def compare(before_path: Path, after_path: Path, show: int = 8) -> None:
    from train.toy.demo_checks import exact_match

    before, after = read_eval(before_path), read_eval(after_path)
    print(f"held-out EM ({len(after)} questions no stage trained on, greedy): "
          f"warm start {exact_match(before):.3f} -> after RL {exact_match(after):.3f}")
    print(f"{'question':<40}{'gold':>12}{'warm start':>14}{'after RL':>14}")
    for uid in list(after)[:show]:
        b, a = before.get(uid, {}), after[uid]
        print(f"{a['question']:<40}{a['golds'][0]:>12}{str(b.get('answer')):>14}{str(a['answer']):>14}")


def dense(index: Path, query: str, topk: int = 3) -> None:
    from retrieval.client import LocalRetrievalClient, contents_of
    from retrieval.index import load_retriever
    from train.search_r1 import protocol

    if not index.is_dir():
        raise DataError(f"no index folder at {index} (build it with python -m retrieval.build)")
    retriever = load_retriever(index)
    res = LocalRetrievalClient(retriever, topk=topk).retrieve([query])
    print(f"{retriever.kind} index {index} ({len(retriever.corpus):,} passages); query: {query}")
    print(protocol.format_observation(contents_of(res[0])).strip()[:500], "...")


def test_question(dataset: str = "nq") -> str:
    """The first ``dataset`` question of the bundled data's recorded test split (data/split.json)."""
    import json

    from train import DATA_DIR

    split, qa = DATA_DIR / "split.json", DATA_DIR / "qa.jsonl"
    if not split.is_file() or not qa.is_file():
        raise DataError(f"{split} and {qa} come with a source checkout")
    test = set(json.loads(split.read_text())["test"])
    with open(qa, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["id"] in test and rec.get("dataset") == dataset:
                return rec["question"]
    raise DataError(f"{split}: no {dataset} question in the test split")


def check(demo_dir: Path, steps: int) -> int:
    from train.toy.demo_checks import demo_checks
    from train.trainer.metrics_file import read_metrics

    run = demo_dir / "learn"
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise DataError(f"no metrics file at {metrics}: did the demo's training stage run?")
    checks = demo_checks(read_metrics(metrics), steps, read_eval(demo_dir / "eval_before.jsonl"),
                         read_eval(demo_dir / "eval_after.jsonl"), run / "plots")
    for c in checks:
        print(c.line())
    failed = [c.name for c in checks if not c.passed]
    if failed:
        print(f"demo FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"demo passed: all {len(checks)} checks")
    return 0


@exit_on_error
def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("compare", help="held-out EM of the warm start and after RL")
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p = sub.add_parser("question", help="the first question of an evaluation file")
    p.add_argument("eval_file", type=Path)
    sub.add_parser("test-question", help="the first NQ question of the recorded test split")
    p = sub.add_parser("dense", help="one search of a dense index")
    p.add_argument("index", type=Path)
    p.add_argument("--query", default=DENSE_QUERY)
    p = sub.add_parser("check", help="the demo's pass criteria (exit 1 when one fails)")
    p.add_argument("demo_dir", type=Path)
    p.add_argument("--steps", type=int, required=True, help="the training steps the demo ran (STEPS)")
    args = ap.parse_args(argv)
    if args.what == "compare":
        compare(args.before, args.after)
    elif args.what == "question":
        print(next(iter(read_eval(args.eval_file).values()))["question"])
    elif args.what == "test-question":
        print(test_question())
    elif args.what == "dense":
        dense(args.index, args.query)
    else:
        return check(args.demo_dir, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
