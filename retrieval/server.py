"""Search-R1 compatible retrieval server: Flask app factory, micro-batching, waitress.

    python -m retrieval.server --index runs/index/minilm                 # 127.0.0.1:8000
    python -m retrieval.server --index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --gpu

``POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`` (without
``score`` when ``return_scores`` is false). ``GET /health``.

One search runs at a time. Concurrent requests put their queries on a queue; the batching
thread takes up to ``max_batch`` queries (waiting at most ``max_wait_ms`` for more after the
first arrives), runs one encoder call and one index search, and hands each request its rows. By default it never
waits: whatever queued while the previous batch ran forms the next batch. A request that finds the server idle
is searched at once on its own thread (no hand-over; ``inline`` on ``/health``). A query text is searched once per
batch, and one asked before is answered from a bounded cache (``--cache-mb``; counters on ``/health``).
``--rerank MODEL`` reranks ``--rerank-depth`` passages per query with a cross-encoder (:mod:`retrieval.rerank`).
"""

from __future__ import annotations

import argparse
import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Optional

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from retrieval.client import MAX_QUERY_CHARS  # the server's default limit (the agent loop caps queries to it)

log = logging.getLogger("retrieval.server")


@dataclass
class ServerConfig:
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_query_chars: int = MAX_QUERY_CHARS
    max_body_bytes: int = 4 << 20
    max_batch: int = 256
    # Characters of query text per encoder call: with max_batch, what bounds one batch's time (a
    # request of 512 x 4,096 characters is served in several batches, interleaved with others).
    max_batch_chars: int = 262144
    # 0 = "natural" batching: take whatever queued while the previous batch ran, never wait
    # (no added latency at low load, large batches under load); > 0 also waits up to this long.
    max_wait_ms: float = 0.0
    # A request that finds the batcher idle is searched on its own thread, without the hand-over to the
    # batching thread (MicroBatcher.search_now); False always goes through the batching thread.
    inline: bool = True
    request_timeout_s: float = 120.0
    # Bytes of search results kept across batches by query text (ResultCache); 0 = none. The command line
    # keeps 256 MiB (--cache-mb); the library default is off so that benchmarks measure searches.
    cache_bytes: int = 0


#: client addresses counted one by one on /health (more are counted together as "other")
MAX_CLIENTS_SHOWN = 256


class SearchTimeout(Exception):
    pass


class _Job:
    """One request: its queries are served in slices (at most max_batch / max_batch_chars per batch),
    interleaved with other requests; the future gets all rows once every slice is done."""

    __slots__ = ("queries", "topk", "future", "results", "next", "failed")

    def __init__(self, queries, topk):
        self.queries, self.topk, self.future = queries, topk, Future()
        self.results: list = [None] * len(queries)
        self.next = 0  # first query not yet taken into a batch
        self.failed = False


class ResultCache:
    """Search results kept by query text, least recently used out first, bounded in bytes.

    An entry holds the rows of the deepest search done for that text (``k`` rows); a request for
    ``topk <= k`` is served from its first ``topk`` rows, as a fresh search of depth ``k`` would be (the
    batcher always searches a batch at its deepest ``topk`` and cuts each request's rows). One cache
    serves one retriever: the app builds it with the batcher, so a server started on another index
    starts empty. Used by the batching thread only, so it takes no lock; ``/health`` reads its counters."""

    def __init__(self, max_bytes: int):
        from collections import OrderedDict

        self.max_bytes = max(0, int(max_bytes))
        self._rows: OrderedDict[str, tuple[int, list, int]] = OrderedDict()  # text -> (k, rows, bytes)
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0

    @staticmethod
    def size(query: str, rows: list) -> int:
        """What an entry costs, counted as Python keeps it (the documents are parsed per search, so the
        entry owns them): ~200 bytes of containers per entry and ~300 per row, plus the text."""
        n = 200 + len(query.encode("utf-8", "replace"))
        for doc, _ in rows:
            n += 300 + sum(len(str(v)) for v in doc.values()) if isinstance(doc, dict) else 300
        return n

    def get(self, query: str, topk: int) -> Optional[list]:
        entry = self._rows.get(query)
        if entry is None or entry[0] < topk:
            self.misses += 1
            return None
        self._rows.move_to_end(query)
        self.hits += 1
        return entry[1]

    def put(self, query: str, k: int, rows: list) -> None:
        if not self.max_bytes:
            return
        old = self._rows.pop(query, None)
        if old is not None:
            self.bytes -= old[2]
        nbytes = self.size(query, rows)
        if nbytes > self.max_bytes:
            return
        self._rows[query] = (k, rows, nbytes)
        self.bytes += nbytes
        while self.bytes > self.max_bytes:
            _, (_, _, b) = self._rows.popitem(last=False)
            self.bytes -= b
            self.evictions += 1

    def stats(self) -> dict:
        return dict(entries=len(self._rows), bytes=self.bytes, max_bytes=self.max_bytes, hits=self.hits,
                    misses=self.misses, evictions=self.evictions)


class MicroBatcher:
    """Merges the queries of concurrent requests into one ``retriever.search`` call.

    Fair and bounded: each batch holds at most ``max_batch`` queries and ``max_batch_chars``
    characters, taken round-robin over the waiting requests, so one maximal request cannot hold the
    index while a one-query request waits. A batch that fails is retried request by request, so only
    the request whose queries break the retriever gets the error.

    A query text is searched once per batch however many requests (or rows of one request) ask it, and
    with ``cache_bytes`` > 0 a text searched before is answered from a :class:`ResultCache` without
    touching the encoder or the index: the samples of one GRPO question often search the same words.

    A request that finds the batcher idle (nothing queued, nothing in a batch, the index free) is searched
    at once on its own thread (:meth:`search_now`): a lone client pays no hand-over to the batching
    thread and back. Requests that arrive meanwhile queue and are batched as usual once it is done."""

    def __init__(self, retriever, max_batch: int = 256, max_wait_ms: float = 0.0, max_batch_chars: int = 262144,
                 cache_bytes: int = 0):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.retriever, self.max_batch, self.max_wait = retriever, max_batch, max_wait_ms / 1000.0
        self.max_chars = max(1, max_batch_chars)
        self._q: queue.Queue[Optional[_Job]] = queue.Queue()
        self._active: list[_Job] = []  # requests with queries not yet batched, in turn order
        self._thread = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._stopped = False
        self.batches = 0
        self.queries = 0
        self.largest_batch = 0
        self.repeated_in_batch = 0  # query rows that shared another row's search in the same batch
        self.cache = ResultCache(cache_bytes)
        self.inline = 0  # requests searched at once on their own thread (the batcher was idle)
        self._searching = threading.Lock()  # one search at a time: the index, the cache and the counters
        self.error: Optional[str] = None  # why the batching thread died, if it did
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def submit(self, queries: list[str], topk: int) -> Future:
        if not self.alive:
            raise RuntimeError(f"the batching thread is not running ({self.error or 'stopped'})")
        job = _Job(queries, topk)
        self._q.put(job)
        return job.future

    def search_now(self, queries: list[str], topk: int) -> Optional[list]:
        """The request's results, searched on the calling thread, when the batcher is idle and the request
        fits one batch; None otherwise (then :meth:`submit` it). Raises what the search raised; a search that
        raises what would kill the batching thread (not an ``Exception``) stops the batcher as it would.
        The request deadline (``request_timeout_s``) is for requests waiting on the batching thread: a
        search here is answered when it ends."""
        if (not self.alive or self._active or not self._q.empty() or len(queries) > self.max_batch
                or sum(map(len, queries)) > self.max_chars):
            return None
        if not self._searching.acquire(blocking=False):
            return None
        try:
            if self._active or not self._q.empty():  # a request came in meanwhile: batch them together
                return None
            job = _Job(queries, topk)
            try:
                self._search_locked([(job, 0, len(queries))])
            except Exception:
                raise
            except BaseException as e:  # what would have killed the batching thread: the server is as dead
                self.error = f"{type(e).__name__}: {e}"
                log.exception("a search crashed the server")
                self._stopped = True
                self._q.put(None)
                raise RuntimeError(f"the search crashed ({self.error})") from None
            self.inline += 1
        finally:
            self._searching.release()
        return job.future.result(timeout=0) if job.failed else job.results

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
        with self._searching:
            self._search_locked(slices)

    def _search_locked(self, slices: list[tuple[_Job, int, int]]) -> None:
        k = max(j.topk for j, _, _ in slices)
        rows: dict[str, list] = {}  # query text -> its rows, for this batch
        unique: list[str] = []  # texts to search, each once, in first-asked order
        for job, a, b in slices:
            for q in job.queries[a:b]:
                if q in rows:
                    self.repeated_in_batch += 1
                    continue
                hit = self.cache.get(q, job.topk) if self.cache.max_bytes else None
                if hit is not None:
                    rows[q] = hit
                else:
                    rows[q] = None  # type: ignore[assignment]
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
                    self._search_locked(group)
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


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


def parse_request(body, cfg: ServerConfig) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body; raise BadRequest naming the problem. Unknown fields are ignored."""
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    if "queries" not in body:
        raise BadRequest("'queries' is missing")
    queries = body["queries"]
    if not isinstance(queries, list):
        raise BadRequest("'queries' must be a list of strings")
    if not queries:
        raise BadRequest("'queries' is empty")
    if len(queries) > cfg.max_queries:
        raise BadRequest(f"'queries' has {len(queries)} items; the maximum is {cfg.max_queries}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(f"queries[{i}] is not a string")
        if not q.strip():
            raise BadRequest(f"queries[{i}] is empty")
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadRequest(f"queries[{i}] is not valid text: {e.reason} at character {e.start} "
                             f"({q[e.start]!r}); send UTF-8 text")
        if len(q) > cfg.max_query_chars:
            raise BadRequest(f"queries[{i}] has {len(q)} characters; the maximum is {cfg.max_query_chars}")
    topk = body.get("topk")
    if topk is None:
        topk = cfg.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest("'topk' must be an integer")
    elif not 1 <= topk <= cfg.max_topk:
        raise BadRequest(f"'topk' must be between 1 and {cfg.max_topk}, got {topk}")
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest("'return_scores' must be a boolean")
    return queries, topk, return_scores


def create_app(retriever, config: Optional[ServerConfig] = None) -> Flask:
    """The Flask app. Starts the batching thread; ``app.batcher.close()`` stops it."""
    cfg = config or ServerConfig()
    app = Flask("retrieval")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    batcher = MicroBatcher(retriever, cfg.max_batch, cfg.max_wait_ms, cfg.max_batch_chars, cfg.cache_bytes)
    app.batcher = batcher  # type: ignore[attr-defined]
    app.retrieval_config = cfg  # type: ignore[attr-defined]
    flight = {"n": 0}
    flight_lock = threading.Lock()
    clients: dict[str, int] = {}  # /retrieve requests per client address (a replica per node shows its own)
    from retrieval.index import identity_of
    from retrieval.index import index_id as name_of

    # what this server serves, named (replicas on several nodes must agree: scripts/multinode.sh compares it)
    index_id = name_of(identity_of(retriever))
    app.in_flight = lambda: flight["n"]  # type: ignore[attr-defined]  (graceful shutdown waits on it)

    @app.before_request
    def _count_in():
        with flight_lock:
            flight["n"] += 1

    @app.teardown_request
    def _count_out(exc=None):
        with flight_lock:
            flight["n"] -= 1

    @app.errorhandler(BadRequest)
    def _bad(e: BadRequest):
        return jsonify(error=e.message), e.status

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException):
        messages = {413: f"body too large (maximum {cfg.max_body_bytes} bytes)",
                    404: f"no such path: {request.path}",
                    405: f"method {request.method} not allowed on {request.path}"}
        return jsonify(error=messages.get(e.code, e.description)), e.code

    @app.errorhandler(SearchTimeout)
    def _timeout(e: SearchTimeout):
        return jsonify(error=str(e)), 504

    @app.errorhandler(Exception)
    def _internal(e: Exception):
        log.exception("internal error")
        return jsonify(error=f"internal error: {type(e).__name__}: {e}"), 500

    @app.get("/health")
    def health():
        info = dict(passages=len(retriever.corpus), indexed=retriever.index.ntotal, kind=retriever.kind,
                    index_id=index_id,
                    batches=batcher.batches, queries=batcher.queries, largest_batch=batcher.largest_batch,
                    repeated_in_batch=batcher.repeated_in_batch, inline=batcher.inline,
                    cache=batcher.cache.stats(), clients=dict(clients))
        if hasattr(retriever, "describe"):  # a reranking retriever: its model, depth and time
            info["rerank"] = retriever.describe()
        if not batcher.alive:
            return jsonify(status="error", error=f"the batching thread is not running ({batcher.error or 'stopped'})",
                           **info), 503
        return jsonify(status="ok", **info)

    @app.post("/retrieve")
    def retrieve():
        if not request.is_json:
            raise BadRequest("Content-Type must be application/json", 415)
        try:
            body = request.get_json(silent=True)
        except RecursionError:
            raise BadRequest("body nests too deeply") from None
        if body is None:
            raise BadRequest("body is not valid JSON")
        queries, topk, return_scores = parse_request(body, cfg)
        addr = request.remote_addr or "unknown"
        with flight_lock:
            if addr in clients or len(clients) < MAX_CLIENTS_SHOWN:
                clients[addr] = clients.get(addr, 0) + 1
            else:
                clients["other"] = clients.get("other", 0) + 1
        if not batcher.alive:
            raise BadRequest(f"the batching thread is not running ({batcher.error or 'stopped'}); restart the server",
                             503)
        try:
            results = batcher.search_now(queries, topk) if cfg.inline else None
            if results is None:
                results = batcher.submit(queries, topk).result(timeout=cfg.request_timeout_s)
        except FutureTimeout:
            raise SearchTimeout(f"the search of {len(queries)} queries did not finish within "
                                f"{cfg.request_timeout_s:g} s (request_timeout_s): the server is overloaded "
                                f"or the index is slow; retry later or send fewer queries per request") from None
        if return_scores:
            out = [[{"document": doc, "score": score} for doc, score in r] for r in results]
        else:
            out = [[doc for doc, _ in r] for r in results]
        return jsonify(result=out)

    return app


def default_threads(max_batch: int) -> int:
    """Request threads: each waits on its batch, so fewer threads than ``max_batch`` single-query
    requests would cap every batch below ``max_batch``; 32 more keep /health and parsing responsive."""
    return max(64, max_batch + 32)


def make_server(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: Optional[int] = None,
                connection_limit: int = 4096, channel_timeout: int = 10):
    """A waitress server (threaded production WSGI) for the app; ``.run()`` serves.

    Sized for a training step's burst (thousands of concurrent searches): ``connection_limit``
    connections (the open-files limit is raised to fit), idle or stalled connections closed after
    ``channel_timeout`` seconds, request bodies over the app's limit refused from their
    Content-Length (before waitress spools them to disk), and poll() instead of select()."""
    from waitress.server import create_server

    threads = threads or default_threads(app.retrieval_config.max_batch)
    _raise_open_files(connection_limit + threads + 64)
    log.warning("serving on http://%s:%d (threads=%d, connection_limit=%d)", host, port, threads, connection_limit)
    return create_server(app, host=host, port=port, threads=threads, connection_limit=connection_limit,
                         channel_timeout=channel_timeout, cleanup_interval=max(1, channel_timeout // 5),
                         max_request_body_size=app.retrieval_config.max_body_bytes, ident="retrieval",
                         # poll(), not select(): select() fails outright past 1,024 descriptors
                         # ("filedescriptor out of range"), which ~1,000 idle connections reach
                         asyncore_use_poll=True)


def close_server(server) -> None:
    """Stop a waitress server made by :func:`make_server` (or ``waitress.create_server``) from another thread:
    its task threads finish first (waitress's own ``close()`` closes the wake-up pipe under a thread still
    answering, which then logs "Bad file descriptor"), then the sockets close."""
    server.task_dispatcher.shutdown(timeout=10)
    server.close()


def _raise_open_files(want: int) -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def install_graceful_shutdown(server, app: Flask, drain_timeout: float) -> None:
    """On SIGTERM (or SIGINT): stop accepting, let in-flight requests finish and their responses go
    out (at most ``drain_timeout`` s), then return from ``server.run()``; ``main`` exits 0."""
    import _thread
    import signal

    def drain():
        # Close the listening socket from here, not in the signal handler: the interrupted select()
        # is retried with the old descriptor lists, and a descriptor closed under it fails the loop.
        server.pull_trigger()
        time.sleep(0.2)
        try:
            server.socket.close()
        except OSError:
            pass
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and (app.in_flight() > 0 or _pending_output(server)):
            time.sleep(0.05)
        left = app.in_flight()
        if left:
            log.warning("shutting down with %d requests still running after %.0f s", left, drain_timeout)
        server._drained = True
        _thread.interrupt_main()  # -> on_signal raises KeyboardInterrupt in the loop; serve() returns

    def on_signal(signum, frame):
        if getattr(server, "_drained", False):
            raise KeyboardInterrupt
        if getattr(server, "_draining", False):
            return
        server._draining = True
        log.warning("signal %d: no new connections; draining %d in-flight requests", signum, app.in_flight())
        server.accepting = False
        server.del_channel()  # out of the loop's map: no more accepts
        threading.Thread(target=drain, name="retrieval-drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _pending_output(server) -> bool:
    for ch in list(server._map.values()):
        if getattr(ch, "requests", None) or getattr(ch, "total_outbufs_len", 0):
            return True
    return False


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: Optional[int] = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain in-flight requests and return."""
    server = make_server(app, host, port, threads)
    install_graceful_shutdown(server, app, app.retrieval_config.request_timeout_s + 5)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.task_dispatcher.shutdown(timeout=5)
        app.batcher.close()
    log.warning("stopped")


def main(argv=None) -> None:
    from retrieval.index import load_retriever

    ap = argparse.ArgumentParser(prog="python -m retrieval.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="index directory (manifest.json), a .index file, or a Lucene dir")
    ap.add_argument("--corpus", default=None, help="corpus jsonl (needed without a manifest)")
    ap.add_argument("--encoder", default=None, help="encoder for a bare .index file (e.g. intfloat/e5-base-v2)")
    ap.add_argument("--kind", choices=["dense", "bm25", "lucene"], default=None)
    ap.add_argument("--host", default="127.0.0.1", help="bind address; 0.0.0.0 for multi-node training")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=None,
                    help="request threads (default: max(64, max-batch + 32), so a batch can fill up)")
    ap.add_argument("--topk", type=int, default=3, help="default topk when a request gives none")
    ap.add_argument("--max-batch", type=int, default=256, help="queries per encoder/index call (1 = no batching)")
    ap.add_argument("--max-wait-ms", type=float, default=0.0,
                    help="extra wait for more queries after the first (0: batch what queued meanwhile)")
    ap.add_argument("--gpu", action="store_true",
                    help="search on all GPUs: a flat index exactly in torch (fp16 shards; capability checked), an "
                         "IVF index with faiss-gpu (the gpu extra)")
    ap.add_argument("--gpu-workspace-mb", type=int, default=256,
                    help="with --gpu: search scratch per GPU in MiB (score blocks; bounds what torch's allocator "
                         "keeps beside a training job on the same GPU)")
    ap.add_argument("--cache-mb", type=int, default=256,
                    help="MiB of results kept by query text, so a query asked again (the samples of one GRPO "
                         "question often search the same words) skips the encoder and the index; 0 = off")
    ap.add_argument("--mmap", action="store_true", help="memory-map an on-disk flat index")
    ap.add_argument("--device", default=None, help="encoder device (default: cuda if available)")
    ap.add_argument("--rerank", default=None, metavar="MODEL",
                    help="rerank with this cross-encoder (a hub name or a folder; Search-R1's: "
                         "cross-encoder/ms-marco-MiniLM-L12-v2): retrieve --rerank-depth, return the best topk")
    ap.add_argument("--rerank-depth", type=int, default=10, help="passages retrieved per query to rerank (10)")
    ap.add_argument("--rerank-batch", type=int, default=32, help="(query, passage) pairs per cross-encoder call")
    ap.add_argument("--rerank-max-length", type=int, default=512, help="tokens per (query, passage) pair")
    args = ap.parse_args(argv)
    if args.max_batch < 1:
        ap.error("--max-batch must be >= 1")
    if not 1 <= args.topk <= 100:
        ap.error("--topk must be between 1 and 100")
    if args.gpu_workspace_mb <= 0:
        ap.error(f"--gpu-workspace-mb must be > 0 (MiB of search scratch per GPU), got {args.gpu_workspace_mb}")
    if args.cache_mb < 0:
        ap.error(f"--cache-mb must be >= 0 (MiB of cached results; 0 = off), got {args.cache_mb}")
    if args.rerank_depth < 1 or args.rerank_batch < 1 or args.rerank_max_length < 8:
        ap.error("--rerank-depth and --rerank-batch must be >= 1 and --rerank-max-length >= 8")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from retrieval.corpus import CorpusError
    from retrieval.flat import FlatIndexError, UnsupportedGPU
    from retrieval.index import IndexLoadError

    try:
        retriever = load_retriever(args.index, args.corpus, encoder=args.encoder, kind=args.kind, mmap=args.mmap,
                                   gpu=args.gpu, device=args.device, gpu_workspace_bytes=args.gpu_workspace_mb << 20)
    except (CorpusError, IndexLoadError, FileNotFoundError, FlatIndexError, UnsupportedGPU) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    if args.rerank:
        from retrieval.rerank import CrossEncoder, RerankingRetriever

        try:
            reranker = CrossEncoder(args.rerank, device=args.device, batch_size=args.rerank_batch,
                                    max_length=args.rerank_max_length)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        retriever = RerankingRetriever(retriever, reranker, depth=args.rerank_depth)
    cfg = ServerConfig(default_topk=args.topk, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                       cache_bytes=args.cache_mb << 20)
    serve(create_app(retriever, cfg), args.host, args.port, args.threads)


if __name__ == "__main__":
    main()
