"""The 7-benchmark evaluation: greedy inference over a test parquet, EM/F1 per source.

    python -m train.evaluate --model CKPT --data data/processed/test.parquet [--backend vllm]
        [--method search_r1|direct|cot|rag] [--engines N] [--tensor-parallel-size K]
        [--sources nq,hotpotqa] [--limit N] [--out runs/eval/CKPT.jsonl] [--paper-row "3B-Ins GRPO+LLDS"]
    python -m train.evaluate --checkpoints CKPT_DIR --data data/processed/val_sample.parquet [--out DIR]

Per-sample results go to one jsonl (resumable: rows already there are skipped); the table prints EM
(and F1) per data_source and the macro average, beside the paper's numbers when a row is given
(``data/paper_results.json``, with its source). With GPUs, one engine per GPU (``--engines``,
default all; :mod:`train.engines`). ``--method`` picks the Search-R1 agent or a baseline of its
table (direct answer, chain of thought, RAG with the top-3 passages; prompts in
:mod:`train.protocol`). ``--checkpoints`` evaluates every saved ``global_step_N`` of a run (merged
to HF format on the fly), one row per step, plots EM against step beside the training reward, and
names the best step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

PAPER_RESULTS = Path(__file__).resolve().parent.parent / "data" / "paper_results.json"
ORDER = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
TEST_QUESTIONS = 51_713  # the 7 test sets of data/processed/test.parquet


def load_rows(path: str, sources: Optional[list[str]], limit: Optional[int]) -> list[dict]:
    import pandas as pd

    if not Path(path).is_file():
        raise SystemExit(f"error: --data not found: {path}")
    df = pd.read_parquet(path)
    missing = {"data_source", "prompt", "reward_model", "extra_info"} - set(df.columns)
    if missing:
        raise SystemExit(f"error: {path} lacks columns {sorted(missing)} (make it with `python -m train.data_prep`)")
    rows = []
    per_source: dict[str, int] = defaultdict(int)
    for i, r in enumerate(df.itertuples(index=False)):
        if sources and r.data_source not in sources:
            continue
        if limit is not None and per_source[r.data_source] >= limit:
            continue
        per_source[r.data_source] += 1
        info = dict(r.extra_info)
        question = info.get("question") or _question_from_prompt(r.prompt)
        rows.append({"uid": str(info.get("uid", f"{r.data_source}-{i}")), "data_source": r.data_source,
                     "question": question, "golds": list(r.reward_model["ground_truth"]["target"])})
    return rows


def _question_from_prompt(prompt) -> str:
    text = list(prompt)[-1]["content"]
    return text.rsplit("Question:", 1)[-1].strip()


def saw_failed_search(d: dict) -> bool:
    """A stored row whose trajectory got the failure observation (older files have no count)."""
    from train import protocol

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


class FailureWindow:
    """The share of failed searches over the last ``size`` searches: the retriever is taken for down
    when it passes ``max_rate`` (with at least ``min_searches`` in the window)."""

    def __init__(self, max_rate: float, size: int = 50, min_searches: int = 10):
        from collections import deque

        self.max_rate, self.min_searches = max_rate, min_searches
        self.window: "deque[bool]" = deque(maxlen=size)

    def add(self, searches: int, failed: int) -> None:
        self.window.extend([True] * failed + [False] * max(0, searches - failed))

    def down(self) -> bool:
        n = len(self.window)
        return n >= self.min_searches and sum(self.window) / n > self.max_rate

    def describe(self) -> str:
        return f"{sum(self.window)} of the last {len(self.window)} searches failed"


class RetrieverDown(RuntimeError):
    pass


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
        raise SystemExit(f"error: --paper-row {name!r} unknown; choose from: {', '.join(rows)}")
    print(f"paper row {name!r}: {data.get('row_sources', {}).get(name, data['source'])}")
    return rows[name]


async def evaluate(rows: list[dict], asker, out_path: Path, max_failure_rate: float = 0.5,
                   stats: Optional[dict] = None) -> list[dict]:
    """Ask every row not already in ``out_path`` and append its result there. ``stats`` (when given)
    gets ``asked``, ``generated_tokens`` and ``wall_s`` of this call."""
    import time

    from tqdm import tqdm

    from train.reward import compute_score

    done = read_done(out_path)
    stale = [r["uid"] for r in rows if r["uid"] in done
             and (done[r["uid"]].get("question"), done[r["uid"]].get("golds")) != (r["question"], r["golds"])]
    if stale:
        from train.inference import InferenceError

        raise InferenceError(f"{out_path} holds results for other data: {len(stale)} rows (e.g. uid {stale[0]!r}) "
                             f"have a different question or gold answers than --data; pass another --out, or "
                             f"delete the file to start over")
    todo = [r for r in rows if r["uid"] not in done]
    if done:
        print(f"resuming: {len(rows) - len(todo)} of {len(rows)} rows already in {out_path}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.is_file():  # rewrite with the results only (no line an interruption cut short, no row
        # with a failed search), so appends start on a clean line
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in done.values()), encoding="utf-8")
        os.replace(tmp, out_path)
    bar = tqdm(total=len(todo), desc="evaluating", file=sys.stderr, unit="q")
    window = FailureWindow(max_failure_rate)
    counts = {"asked": 0, "generated_tokens": 0}
    t0 = time.perf_counter()
    left_out: list[str] = []  # rows whose trajectory saw a failed search: not written, redone next time
    stop: list[str] = []
    with open(out_path, "a", encoding="utf-8") as f:
        async def one(row):
            res = await asker.ask(row["question"])
            window.add(res.failed_searches + res.valid_searches, res.failed_searches)
            bar.update(1)
            counts["asked"] += 1
            counts["generated_tokens"] += res.generated_tokens
            if res.failed_searches:
                left_out.append(row["uid"])
                if window.down() and not stop:
                    stop.append(window.describe())
                return
            s = compute_score(row["data_source"], res.response, row["golds"])
            d = {"uid": row["uid"], "data_source": row["data_source"], "question": row["question"],
                 "golds": row["golds"], "answer": res.answer, "em": s["em"], "f1": s["f1"],
                 "searches": res.searches, "failed_searches": 0, "stop_reason": res.stop_reason,
                 "generated_tokens": res.generated_tokens, "trajectory": res.response}
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
            f.flush()
            done[row["uid"]] = d

        # A fixed pool of workers (the asker's concurrency): hundreds of questions in flight for a
        # batching engine, and no coroutine or agent loop built for a question before its turn.
        queue = iter(todo)

        async def worker():
            for row in queue:
                if stop:
                    return
                await one(row)

        await asyncio.gather(*(worker() for _ in range(min(getattr(asker, "concurrency", 256), len(todo)) or 1)))
    bar.close()
    if stats is not None:
        stats.update(counts, wall_s=time.perf_counter() - t0)
    results = [done[r["uid"]] for r in rows if r["uid"] in done]
    if stop or left_out:
        url = getattr(getattr(asker, "client", None), "url", "the retriever")
        parts = []
        if stop:
            parts.append(f"stopped early: {stop[0]} (more than --max-failure-rate {max_failure_rate:g}); is the "
                         f"retriever at {url} up (python -m retrieval.client {str(url).removesuffix('/retrieve')})?")
        if left_out:
            parts.append(f"{len(left_out)} rows saw a failed search and were not written (e.g. uid {left_out[0]!r})")
        not_started = len(rows) - len(results) - len(left_out)
        if not_started:
            parts.append(f"{not_started} rows were not started")
        parts.append(f"{len(results)} of {len(rows)} rows are in {out_path}; rerun the same command once the retriever "
                     f"answers: finished rows are kept, the others are evaluated")
        raise RetrieverDown("; ".join(parts), results)
    return results


def build_parser() -> argparse.ArgumentParser:
    from train import protocol

    ap = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder or hub id (or --checkpoints)")
    ap.add_argument("--checkpoints", default=None, metavar="CKPT_DIR",
                    help="evaluate every complete global_step_N in CKPT_DIR (a run's trainer.default_local_dir)")
    ap.add_argument("--data", required=True, help="test parquet (train.data_prep)")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--method", choices=list(protocol.METHODS), default="search_r1",
                    help="search_r1 (the agent; default) or a baseline: direct, cot, rag (top-k passages in the prompt)")
    ap.add_argument("--engines", type=int, default=None,
                    help="inference engines, one process each (default: one per visible GPU, or per "
                         "--tensor-parallel-size GPUs; 1 without GPUs)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per vLLM engine (default 1)")
    ap.add_argument("--sources", default=None, help="comma-separated data_source names")
    ap.add_argument("--limit", type=int, default=None, help="at most N rows per source")
    ap.add_argument("--out", default=None, help="per-sample jsonl (default runs/eval/<model>.jsonl); with "
                                                "--checkpoints a folder (default CKPT_DIR/eval)")
    ap.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    ap.add_argument("--index", default=None)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=500)
    ap.add_argument("--device", default=None)
    ap.add_argument("--concurrency", type=int, default=256, help="questions in flight per engine (default 256)")
    ap.add_argument("--paper-row", default=None, help="print the paper's numbers for this row beside ours")
    ap.add_argument("--max-failure-rate", type=float, default=0.5,
                    help="stop when more than this share of the last 50 searches failed (default 0.5); rows "
                         "that saw a failed search are never written")
    from train.inference import add_engine_flags

    add_engine_flags(ap)
    return ap


def build_asker(args, generator=None):
    """The asker for one engine in this process (``generator`` replaces the model backend in tests)."""
    from train.inference import Asker, engine_settings, load_tokenizer_and_check, make_generator, make_search_client

    tokenizer = getattr(generator, "tokenizer", None) or load_tokenizer_and_check(args.model)
    client = None
    if args.method in ("search_r1", "rag"):  # direct and cot need no retriever
        client = make_search_client(args.retriever_url, args.corpus, args.index, topk=args.topk)
    gen = generator or make_generator(args.model, args.backend, args.device,
                                      tensor_parallel_size=args.tensor_parallel_size, vllm=engine_settings(args))
    return Asker(gen, tokenizer, client, max_turns=args.max_turns, topk=args.topk, temperature=0.0,
                 max_new_tokens=args.max_new_tokens, concurrency=args.concurrency, model_path=args.model,
                 method=args.method)


def _worker_argv(args, model: str) -> list[str]:
    argv = ["--model", model, "--data", args.data, "--backend", args.backend, "--method", args.method,
            "--retriever-url", args.retriever_url, "--max-turns", str(args.max_turns), "--topk", str(args.topk),
            "--max-new-tokens", str(args.max_new_tokens), "--tensor-parallel-size", str(args.tensor_parallel_size),
            "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.max_num_seqs:
        argv += ["--max-num-seqs", str(args.max_num_seqs)]
    for flag, value in (("--index", args.index), ("--corpus", args.corpus), ("--device", args.device)):
        if value:
            argv += [flag, value]
    return argv


def run_model(args, model: str, rows: list[dict], out: Path, generator=None) -> tuple[list[dict], dict]:
    """Evaluate ``model`` on ``rows`` into ``out`` with one engine in this process or a pool of them;
    returns the results and this run's ``stats`` (asked, generated_tokens, wall_s, engines)."""
    from train.engines import EnginePool, plan, visible_gpus

    devices = [None] if generator is not None else plan(args.engines, args.tensor_parallel_size, visible_gpus())
    stats: dict = {"engines": len(devices), "gpus": sum(len(d.split(",")) for d in devices if d)}
    if len(devices) == 1:
        asker = build_asker(argparse.Namespace(**{**vars(args), "model": model}), generator)
        return asyncio.run(evaluate(rows, asker, out, args.max_failure_rate, stats)), stats

    async def pooled():
        pool = EnginePool(_worker_argv(args, model), devices, out, concurrency=args.concurrency)
        await pool.start()
        try:
            return await evaluate(rows, pool, out, args.max_failure_rate, stats)
        finally:
            await pool.close()
            stats["reasked"] = pool.reasked

    return asyncio.run(pooled()), stats


def describe_speed(stats: dict) -> str:
    n, wall, tok = stats.get("asked", 0), stats.get("wall_s", 0.0), stats.get("generated_tokens", 0)
    if not n or wall <= 0:
        return "nothing left to ask (every row was already in the results file)"
    text = (f"{n} questions in {wall:.1f} s on {stats['engines']} engine{'s' if stats['engines'] > 1 else ''}: "
            f"{n / wall:.2f} questions/s, {tok / wall:.1f} generated tokens/s")
    if stats.get("reasked"):
        text += f" ({stats['reasked']} asked again after their engine died)"
    if stats.get("gpus"):  # the cost of the whole test set at this rate (an estimate: rates vary by source)
        text += f"; at this rate the {TEST_QUESTIONS:,} test questions take {stats['gpus'] * wall / n * TEST_QUESTIONS / 3600:.2f} GPU-hours"
    return text


def _check_args(ap, args) -> None:
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    if args.concurrency < 1:
        ap.error("--concurrency must be >= 1")
    if not 0.0 <= args.max_failure_rate <= 1.0:
        ap.error("--max-failure-rate must be in [0, 1]")
    if args.engines is not None and args.engines < 1:
        ap.error("--engines must be >= 1")
    if args.tensor_parallel_size < 1:
        ap.error("--tensor-parallel-size must be >= 1")
    if args.tensor_parallel_size > 1 and args.backend != "vllm":
        ap.error("--tensor-parallel-size needs --backend vllm")
    from train.inference import check_engine_flags

    check_engine_flags(ap, args)
    if bool(args.model) == bool(args.checkpoints):
        ap.error("give --model or --checkpoints (one of them)")


def main(argv=None, generator=None) -> int:
    from train.engines import EnginesDown
    from train.inference import EngineDead, InferenceError

    ap = build_parser()
    args = ap.parse_args(argv)
    _check_args(ap, args)
    paper = paper_row(args.paper_row)
    rows = load_rows(args.data, args.sources.split(",") if args.sources else None, args.limit)
    if not rows:
        print("error: no rows selected", file=sys.stderr)
        return 2
    try:
        if args.checkpoints:
            from train.eval_steps import evaluate_checkpoints

            return evaluate_checkpoints(args, rows, paper, generator)
        out = Path(args.out or Path("runs/eval") / (Path(args.model.rstrip("/")).name + ".jsonl"))
        results, stats = run_model(args, args.model, rows, out, generator)
    except InferenceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (EnginesDown, EngineDead) as e:
        print(f"error: {e}; the rows written so far are kept in the results file: rerun the same command "
              f"to evaluate the others", file=sys.stderr)
        return 4
    except RetrieverDown as e:
        message, partial = e.args
        if partial:
            print(f"partial table ({len(partial)} of {len(rows)} rows; not a result):")
            print(table(partial, paper))
        print(f"error: {message}", file=sys.stderr)
        return 3
    print(table(results, paper))
    print(describe_speed(stats))
    print(f"per-sample results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
