"""The batching engine of the retrieval server: one thread owns the encoder and the index.

Concurrent requests put their queries on a queue; the batching thread takes up to ``max_batch`` queries
and ``max_batch_chars`` characters (round-robin over the waiting requests), runs one encoder call and one
index search, and hands each request its rows. With ``max_wait_ms`` 0 it never waits: whatever queued
while the previous batch ran forms the next batch. A query text is searched once per batch, and one asked
before is answered from the :class:`~retrieval.cache.ResultCache`. No Flask here: the HTTP side is
:mod:`retrieval.app`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional

from retrieval.cache import ResultCache
from retrieval.settings import ServerConfig

log = logging.getLogger("retrieval.server")


class SearchTimeout(Exception):
    """A request waited longer than its deadline for its batches (HTTP 504)."""


class _Job:
    """One request: its queries are served in slices (at most max_batch / max_batch_chars per batch),
    interleaved with other requests; the future gets all rows once every slice is done."""

    __slots__ = ("queries", "topk", "future", "results", "next", "failed")

    def __init__(self, queries, topk):
        self.queries, self.topk, self.future = queries, topk, Future()
        self.results: list = [None] * len(queries)
        self.next = 0  # first query not yet taken into a batch
        self.failed = False


class MicroBatcher:
    """Merges the queries of concurrent requests into one ``retriever.search`` call.

    Fair and bounded: each batch holds at most ``max_batch`` queries and ``max_batch_chars``
    characters, taken round-robin over the waiting requests, so one maximal request cannot hold the
    index while a one-query request waits. A batch that fails is retried request by request, so only
    the request whose queries break the retriever gets the error.

    A query text is searched once per batch however many requests (or rows of one request) ask it, and
    with ``cache_bytes`` > 0 a text searched before is answered from a :class:`ResultCache` without
    touching the encoder or the index: the samples of one GRPO question often search the same words.

    All searching happens on one thread, the batching thread, which the batcher owns for its life: the
    encoder, the index and a reranker run nowhere else. torch keeps a cuBLAS handle and workspace per
    (thread, GPU) for the thread's life (32 MiB on sm_90), so device work on a server's rotating request
    threads would pin one per thread; here it is one. A lone request costs no wait: the thread blocks on
    the queue and starts a batch the moment a request lands (``max_wait_ms`` 0)."""

    def __init__(self, retriever=None, config: Optional[ServerConfig] = None, *,
                 load: Optional[Callable[[], object]] = None):
        """``config``: the server's settings (this reads ``max_batch``, ``max_batch_chars``, ``max_wait_ms`` and
        ``cache_bytes``; default :class:`~retrieval.settings.ServerConfig`'s). ``retriever``, or ``load``: a
        function that makes it, run on the batching thread before it serves
        (the command line's way: the encoder and the index are then loaded, and any GPU memory taken, by the
        thread that uses them, and no other thread of the process ever runs torch). On CPU that matters too:
        libgomp keeps its OpenMP threads spinning between parallel regions only while the process has no more
        of them than cores, and each thread that ever ran a torch op keeps a team of its own; past that count
        every team sleeps between the small regions of one encoder call (one MiniLM query 1.79x slower on a
        second thread: ``python bench/bench_retrieval.py --parts teams``). What ``load`` raises is raised here."""
        cfg = config or ServerConfig()
        problems = cfg.problems()
        if problems:
            raise ValueError("; ".join(problems))
        if (retriever is None) == (load is None):
            raise ValueError("give a retriever or a load function, not both")
        self.config = cfg
        self.retriever, self.max_batch, self.max_wait = retriever, cfg.max_batch, cfg.max_wait_ms / 1000.0
        self._load, self._loaded = load, threading.Event()
        self._load_error: Optional[BaseException] = None
        self.max_chars = cfg.max_batch_chars
        self._q: queue.Queue[Optional[_Job]] = queue.Queue()
        self._active: list[_Job] = []  # requests with queries not yet batched, in turn order
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._stopped = False
        self.batches = 0
        self.queries = 0
        self.largest_batch = 0
        self.repeated_in_batch = 0  # query rows that shared another row's search in the same batch
        self.cache = ResultCache(cfg.cache_bytes)
        self.error: Optional[str] = None  # why the batching thread died, if it did
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            self._thread.join(timeout=5)
            raise self._load_error

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    @property
    def thread_name(self) -> str:
        """The one thread that searches (tests and the GPU check assert that no other does)."""
        return self._thread.name

    def submit(self, queries: list[str], topk: int) -> Future:
        if not self.alive:
            raise RuntimeError(f"the batching thread is not running ({self.error or 'stopped'})")
        job = _Job(queries, topk)
        self._q.put(job)
        return job.future

    def search(self, queries: list[str], topk: int, timeout: Optional[float] = None) -> list:
        """The request's rows (per query, ``(doc, score)`` pairs) once its batches are done; raises what the
        search raised, or :class:`SearchTimeout` after ``timeout`` seconds (the request's deadline)."""
        try:
            return self.submit(queries, topk).result(timeout=timeout)
        except FutureTimeout:
            raise SearchTimeout(f"the search of {len(queries)} queries did not finish within {timeout:g} s "
                                f"(request_timeout_s): the server is overloaded or the index is slow; retry "
                                f"later or send fewer queries per request") from None

    def close(self) -> None:
        self._stopped = True
        self._q.put(None)
        self._thread.join(timeout=5)

    def _drain_queue(self, block: bool, timeout: Optional[float] = None) -> bool:
        """Move submitted jobs to the active list; False when asked to stop."""
        try:
            job = self._q.get(timeout=timeout) if block else self._q.get_nowait()
        except queue.Empty:
            return True
        while True:
            if job is None:
                return False
            self._active.append(job)
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                return True

    def _take(self) -> list[tuple[_Job, int, int]]:
        """Slices (job, start, end) for one batch: round-robin, each request a fair share of the room."""
        taken: list[tuple[_Job, int, int]] = []
        n = chars = 0
        while n < self.max_batch and chars < self.max_chars:
            pending = [j for j in self._active if j.next < len(j.queries)]
            if not pending:
                break
            share = max(1, (self.max_batch - n) // len(pending))
            progressed = False
            for job in pending:
                start = end = job.next
                while (end < len(job.queries) and end - start < share and n < self.max_batch
                       and (chars + len(job.queries[end]) <= self.max_chars or n == 0)):
                    chars += len(job.queries[end])
                    end += 1
                    n += 1
                if end > start:
                    taken.append((job, start, end))
                    job.next = end
                    progressed = True
                if n >= self.max_batch or chars >= self.max_chars:
                    break
            if not progressed:
                break
        # requests that still have queries go to the back: the next batch starts with the others
        done_first = [j for j in self._active if j.next >= len(j.queries)]
        rest = [j for j in self._active if j.next < len(j.queries)]
        taken_jobs = {id(j) for j, _, _ in taken}
        self._active = done_first + [j for j in rest if id(j) not in taken_jobs] + \
            [j for j in rest if id(j) in taken_jobs]
        return taken

    def _search(self, slices: list[tuple[_Job, int, int]]) -> None:
        k = max(j.topk for j, _, _ in slices)  # the batch's depth: every text is searched this deep
        need: dict[str, int] = {}  # query text -> the deepest topk this batch asks of it
        for job, a, b in slices:
            for q in job.queries[a:b]:
                if q in need:
                    self.repeated_in_batch += 1
                need[q] = max(need.get(q, 0), job.topk)
        rows: dict[str, list] = {}  # query text -> its rows, for this batch
        unique: list[str] = []  # texts to search, each once, in first-asked order
        for q, depth in need.items():
            hit = self.cache.get(q, depth) if self.cache.max_bytes else None
            if hit is not None:  # kept at least as deep as any request of this batch asks it
                rows[q] = hit
            else:
                unique.append(q)
        try:
            results = self.retriever.search(unique, k) if unique else []
        except Exception as e:  # noqa: BLE001
            if len({id(j) for j, _, _ in slices}) > 1:  # retry request by request: only the culprit fails
                log.warning("a batch of %d queries failed (%s); retrying its requests one by one", len(unique), e)
                by_job: dict[int, list] = {}
                for sl in slices:
                    by_job.setdefault(id(sl[0]), []).append(sl)
                for group in by_job.values():
                    self._search(group)
                return
            job = slices[0][0]
            log.exception("search failed for a request of %d queries", len(job.queries))
            if not job.failed:
                job.failed = True
                job.future.set_exception(e)
            return
        if len(results) != len(unique):
            raise RuntimeError(f"the retriever returned {len(results)} result lists for {len(unique)} queries")
        for q, r in zip(unique, results):
            rows[q] = r
            self.cache.put(q, k, r)
        if unique:
            self.batches += 1
        self.queries += len(unique)
        self.largest_batch = max(self.largest_batch, len(unique))
        for job, a, b in slices:
            for i in range(a, b):
                job.results[i] = rows[job.queries[i]][: job.topk]

    def _finish(self) -> None:
        for job in [j for j in self._active if j.next >= len(j.queries)]:
            if not job.failed and not job.future.done():
                job.future.set_result(job.results)
        self._active = [j for j in self._active if j.next < len(j.queries) and not j.failed]

    def _run(self) -> None:
        try:
            if self._load is not None:
                self.retriever = self._load()
        except BaseException as e:  # noqa: BLE001  (raised in the constructor, on the caller's thread)
            self._load_error = e
            return
        finally:
            self._loaded.set()
        try:
            while True:
                if not self._drain_queue(block=not self._active):
                    return
                if self.max_wait:
                    deadline = time.perf_counter() + self.max_wait
                    while sum(len(j.queries) - j.next for j in self._active) < self.max_batch:
                        left = deadline - time.perf_counter()
                        if left <= 0 or not self._drain_queue(block=True, timeout=left):
                            break
                slices = self._take()
                if slices:
                    self._search(slices)
                self._finish()
        except BaseException as e:  # the thread dies: /health says so, requests get 503
            self.error = f"{type(e).__name__}: {e}"
            log.exception("the batching thread died")
            for job in self._active:
                if not job.future.done():
                    job.future.set_exception(RuntimeError(f"the batching thread died ({self.error})"))
            raise


