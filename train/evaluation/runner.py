"""Running the evaluation: every row not yet in the results file is asked (by one engine in this
process, or by an :class:`~train.evaluation.pool.EnginePool`) and appended as it finishes; too many
failed searches stop it (:class:`~train.errors.RetrieverDown`, with the results so far)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from train.errors import RetrieverDown
from train.inference.results_file import ResultsFile

if TYPE_CHECKING:
    from train.evaluation.options import EvalOptions


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



async def evaluate(rows: list[dict], asker, out_path: Path, max_failure_rate: float = 0.5,
                   stats: Optional[dict] = None, made_by: Optional[dict] = None) -> list[dict]:
    """Ask every row not already in ``out_path`` and append its result there. ``stats`` (when given)
    gets ``asked``, ``generated_tokens`` and ``wall_s`` of this call; ``made_by``: the settings that decide
    the answers, recorded beside the file and checked on a resume (:class:`ResultsFile`)."""
    import time

    from tqdm import tqdm

    from train.search_r1.reward import compute_score

    results_file = ResultsFile(out_path, rows, key="uid", same=("question", "golds"), made_by=made_by).open()
    todo = results_file.todo()
    bar = tqdm(total=len(todo), desc="evaluating", file=sys.stderr, unit="q")
    window = FailureWindow(max_failure_rate)
    counts = {"asked": 0, "generated_tokens": 0}
    t0 = time.perf_counter()
    left_out: list[str] = []  # rows whose trajectory saw a failed search: not written, redone next time
    stop: list[str] = []
    try:
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
            results_file.append(d)

        # A fixed pool of workers (the asker's concurrency): hundreds of questions in flight for a
        # batching engine, and no coroutine or agent loop built for a question before its turn.
        queue = iter(todo)

        async def worker():
            for row in queue:
                if stop:
                    return
                await one(row)

        await asyncio.gather(*(worker() for _ in range(min(getattr(asker, "concurrency", 256), len(todo)) or 1)))
    finally:
        results = results_file.finish()  # in input order; on any stop too (what finished is kept)
    bar.close()
    if stats is not None:
        stats.update(counts, wall_s=time.perf_counter() - t0)
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
        raise RetrieverDown("; ".join(parts), results=results)
    return results


def run_model(opts: "EvalOptions", model: str, rows: list[dict], out: Path, generator=None) -> tuple[list[dict], dict]:
    """Evaluate ``model`` on ``rows`` into ``out`` with one engine in this process or a pool of them, each
    built from ``opts.ask`` with this model; returns the results and this run's ``stats`` (asked,
    generated_tokens, wall_s, engines)."""
    from train.evaluation.pool import EnginePool, plan, visible_gpus
    from train.inference.asker import build_asker

    settings = opts.ask.replace(model=model)
    made_by = settings.answer_settings()
    devices = [None] if generator is not None else plan(opts.engines, settings.tensor_parallel_size, visible_gpus())
    stats: dict = {"engines": len(devices), "gpus": sum(len(d.split(",")) for d in devices if d)}
    if len(devices) == 1:
        asker = build_asker(settings, generator)
        return asyncio.run(evaluate(rows, asker, out, opts.max_failure_rate, stats, made_by)), stats

    async def pooled():
        pool = EnginePool(settings, devices, out)
        await pool.start()
        try:
            return await evaluate(rows, pool, out, opts.max_failure_rate, stats, made_by)
        finally:
            await pool.close()
            stats["reasked"] = pool.reasked

    return asyncio.run(pooled()), stats
