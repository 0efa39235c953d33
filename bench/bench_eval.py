"""Evaluation speed, baseline and candidate in this process, same questions, greedy:

    python bench/bench_eval.py --parts hf_engine,engines [--questions 60] [--task runs/bench_learn]

- ``hf_engine``: the agent loop (max_turns 4, 64 tokens per turn) over ``--questions`` questions with
  ``model.generate`` one question at a time (train/inference/hf_generate.py, the hf backend before) against the
  batched engine that keeps each trajectory's KV cache across turns (train/inference/hf_engine.py), both with
  every question in flight, rounds alternated (A B B A ...). Printed: questions/s, generated tokens/s,
  the ratio, and whether every trajectory is the same.
- ``engines``: ``train.evaluate`` with 1 engine in this process against 2 engine processes
  (train/evaluation/pool.py), each the batched hf engine on the CPU (the cores split between them).
  Printed: questions/s, the ratio, whether the tables and trajectories are the same.

The policy is the learnable task's warm start (train/learnable.py; built into ``--task`` on first use,
about 4 minutes), which searches and answers, so trajectories have several turns; the retriever is
BM25 over the task's corpus, in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def task_and_index(task: Path) -> tuple[Path, Path]:
    from retrieval.bm25 import build_bm25
    from train.toy import learnable_task as learnable

    learnable.build(task, progress=True)
    index = task / "bench_bm25"
    if not index.is_dir():
        build_bm25(str(task / "corpus.jsonl"), str(index), progress=False)
    return task / "model", index


def questions_of(task: Path, n: int) -> list[str]:
    from train.evaluation.results import load_rows

    rows = load_rows(str(task / "data" / "train.parquet"), None, None)
    return [r["question"] for r in rows[:n]]


def bench_hf_engine(model: Path, index: Path, questions: list[str], rounds: int) -> None:
    from retrieval.client import LocalRetrievalClient
    from retrieval.index import load_retriever
    from train.inference.asker import Asker
    from train.inference.hf_engine import HFBatchedServerManager
    from train.inference.hf_generate import HFServerManager
    from train.inference.settings import AskSettings

    old = HFServerManager.from_pretrained(str(model), device="cpu", seed=0)
    new = HFBatchedServerManager(old.model, old.tokenizer, "cpu", 0)
    client = LocalRetrievalClient(load_retriever(str(index)), topk=3)

    async def one_round(gen):
        asker = Asker(gen, old.tokenizer, client, AskSettings(model=str(model), max_turns=4, temperature=0.0,
                                                              max_new_tokens=64))
        t = time.perf_counter()
        res = await asyncio.gather(*(asker.ask(q) for q in questions))
        return time.perf_counter() - t, res

    times = {"generate": [], "batched": []}
    outputs = {}
    order = ["generate", "batched", "batched", "generate"] * ((rounds + 1) // 2)
    for name in order[: 2 * rounds]:
        new.clear_cache()  # each round starts with no kept cache
        dt, res = asyncio.run(one_round(old if name == "generate" else new))
        times[name].append(dt)
        outputs[name] = res
    same = [(r.response, r.answer) for r in outputs["generate"]] == [(r.response, r.answer) for r in outputs["batched"]]
    tokens = sum(r.generated_tokens for r in outputs["batched"])
    turns = sum(r.searches for r in outputs["batched"]) / len(questions)
    print(f"\nhf backend, {len(questions)} questions ({turns:.2f} searches each, {tokens} generated tokens), "
          f"{rounds} rounds each, best round:")
    print("| engine | s | questions/s | generated tokens/s |\n| --- | ---: | ---: | ---: |")
    for name in ("generate", "batched"):
        best = min(times[name])
        print(f"| {name} | {best:.2f} | {len(questions) / best:.2f} | {tokens / best:.1f} |")
    print(f"speed-up (batched / generate): {min(times['generate']) / min(times['batched']):.2f}x; "
          f"same trajectories: {same}; engine counters {new.describe()}")


def bench_engines(model: Path, index: Path, task: Path, n: int) -> None:
    from train.evaluation.options import EvalOptions
    from train.evaluation.results import load_rows, macro_em
    from train.evaluation.runner import run_model

    rows = load_rows(str(task / "data" / "train.parquet"), None, None)[:n]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for engines in (1, 2):
            opts = EvalOptions.parse(["--model", str(model), "--data", str(task / "data" / "train.parquet"),
                                              "--index", str(index), "--engines", str(engines),
                                              "--max-new-tokens", "64"])
            out = Path(tmp) / f"e{engines}.jsonl"
            t = time.perf_counter()
            res, stats = run_model(opts, str(model), rows, out)
            results[engines] = (time.perf_counter() - t, stats, res)
    print(f"\ntrain.evaluate, {n} questions, hf backend on the CPU ({os.cpu_count()} cores):")
    print("| engines | wall s (start-up included) | questions/s (asking) | generated tokens/s | EM |\n"
          "| ---: | ---: | ---: | ---: | ---: |")
    for e, (wall, stats, res) in results.items():
        print(f"| {e} | {wall:.1f} | {stats['asked'] / stats['wall_s']:.2f} | "
              f"{stats['generated_tokens'] / stats['wall_s']:.1f} | {macro_em(res)[1]:.3f} |")
    (_, s1, r1), (_, s2, r2) = results[1], results[2]
    same = {d["uid"]: d["trajectory"] for d in r1} == {d["uid"]: d["trajectory"] for d in r2}
    print(f"questions/s ratio (2 / 1 engines): {(s2['asked'] / s2['wall_s']) / (s1['asked'] / s1['wall_s']):.2f}; "
          f"same trajectories: {same}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="hf_engine,engines")
    ap.add_argument("--questions", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--task", default="runs/bench_learn", help="the learnable task's folder (built when missing)")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = set(parts) - {"hf_engine", "engines"}
    if unknown:
        ap.error(f"unknown --parts {sorted(unknown)} (known: hf_engine, engines)")
    if args.questions < 1 or args.rounds < 1:
        ap.error("--questions and --rounds must be >= 1")
    task = Path(args.task)
    model, index = task_and_index(task)
    qs = questions_of(task, args.questions)
    if "hf_engine" in parts:
        bench_hf_engine(model, index, qs, args.rounds)
    if "engines" in parts:
        bench_engines(model, index, task, len(qs))


if __name__ == "__main__":
    main()
