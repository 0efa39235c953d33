"""Search-R1 compatible retrieval server: Flask app factory, micro-batching, waitress.

    python -m retrieval.server --index runs/index/minilm                 # 127.0.0.1:8000
    python -m retrieval.server --index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --gpu

``POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`` (without
``score`` when ``return_scores`` is false). ``GET /health``.

One thread owns the index. Concurrent requests put their queries on a queue; the batching
thread takes up to ``max_batch`` queries (waiting at most ``max_wait_ms`` for more after the
first arrives), runs one encoder call and one index search, and hands each request its rows. By default it never
waits: whatever queued while the previous batch ran forms the next batch.
"""

from __future__ import annotations

import argparse
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Optional

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger("retrieval.server")

#: Longest query the server accepts by default (the client caps queries to it: see retrieval.client).
MAX_QUERY_CHARS = 4096


@dataclass
class ServerConfig:
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 512
    max_query_chars: int = MAX_QUERY_CHARS
    max_body_bytes: int = 4 << 20
    max_batch: int = 256
    # 0 = "natural" batching: take whatever queued while the previous batch ran, never wait
    # (no added latency at low load, large batches under load); > 0 also waits up to this long.
    max_wait_ms: float = 0.0
    request_timeout_s: float = 120.0


class _Job:
    __slots__ = ("queries", "topk", "future")

    def __init__(self, queries, topk):
        self.queries, self.topk, self.future = queries, topk, Future()


class MicroBatcher:
    """Merges the queries of concurrent requests into one ``retriever.search`` call."""

    def __init__(self, retriever, max_batch: int = 256, max_wait_ms: float = 0.0):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.retriever, self.max_batch, self.max_wait = retriever, max_batch, max_wait_ms / 1000.0
        self._q: queue.Queue[Optional[_Job]] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="retrieval-batcher", daemon=True)
        self._stopped = False
        self.batches = 0
        self.queries = 0
        self.largest_batch = 0
        self._thread.start()

    def submit(self, queries: list[str], topk: int) -> Future:
        job = _Job(queries, topk)
        self._q.put(job)
        return job.future

    def close(self) -> None:
        self._stopped = True
        self._q.put(None)
        self._thread.join(timeout=5)

    def _gather(self, first: _Job) -> list[_Job]:
        jobs, n = [first], len(first.queries)
        deadline = time.perf_counter() + self.max_wait
        while n < self.max_batch:
            timeout = deadline - time.perf_counter()
            try:
                job = self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._q.put(None)
                break
            jobs.append(job)
            n += len(job.queries)
        return jobs

    def _loop(self) -> None:
        while True:
            first = self._q.get()
            if first is None:
                return
            jobs = self._gather(first)
            queries = [q for j in jobs for q in j.queries]
            k = max(j.topk for j in jobs)
            try:
                results = self.retriever.search(queries, k)
            except Exception as e:  # the request fails, the server keeps serving
                log.exception("search failed for a batch of %d queries", len(queries))
                for j in jobs:
                    j.future.set_exception(e)
                continue
            self.batches += 1
            self.queries += len(queries)
            self.largest_batch = max(self.largest_batch, len(queries))
            pos = 0
            for j in jobs:
                j.future.set_result([r[: j.topk] for r in results[pos: pos + len(j.queries)]])
                pos += len(j.queries)


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
    batcher = MicroBatcher(retriever, cfg.max_batch, cfg.max_wait_ms)
    app.batcher = batcher  # type: ignore[attr-defined]
    app.retrieval_config = cfg  # type: ignore[attr-defined]

    @app.errorhandler(BadRequest)
    def _bad(e: BadRequest):
        return jsonify(error=e.message), e.status

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException):
        messages = {413: f"body too large (maximum {cfg.max_body_bytes} bytes)",
                    404: f"no such path: {request.path}",
                    405: f"method {request.method} not allowed on {request.path}"}
        return jsonify(error=messages.get(e.code, e.description)), e.code

    @app.errorhandler(Exception)
    def _internal(e: Exception):
        log.exception("internal error")
        return jsonify(error=f"internal error: {type(e).__name__}: {e}"), 500

    @app.get("/health")
    def health():
        return jsonify(status="ok", passages=len(retriever.corpus), indexed=retriever.index.ntotal,
                       kind=retriever.kind, batches=batcher.batches, queries=batcher.queries,
                       largest_batch=batcher.largest_batch)

    @app.post("/retrieve")
    def retrieve():
        if not request.is_json:
            raise BadRequest("Content-Type must be application/json", 415)
        body = request.get_json(silent=True)
        if body is None:
            raise BadRequest("body is not valid JSON")
        queries, topk, return_scores = parse_request(body, cfg)
        results = batcher.submit(queries, topk).result(timeout=cfg.request_timeout_s)
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


def make_server(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: Optional[int] = None):
    """A waitress server (threaded production WSGI) for the app; ``.run()`` serves."""
    from waitress.server import create_server

    threads = threads or default_threads(app.retrieval_config.max_batch)
    log.warning("serving on http://%s:%d (threads=%d)", host, port, threads)
    return create_server(app, host=host, port=port, threads=threads, connection_limit=max(1000, 4 * threads),
                         channel_timeout=300, ident="retrieval")


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8000, threads: Optional[int] = None) -> None:
    make_server(app, host, port, threads).run()


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
    ap.add_argument("--gpu", action="store_true", help="FAISS on all GPUs (sharded, fp16)")
    ap.add_argument("--mmap", action="store_true", help="memory-map an on-disk flat index")
    ap.add_argument("--device", default=None, help="encoder device (default: cuda if available)")
    args = ap.parse_args(argv)
    if args.max_batch < 1:
        ap.error("--max-batch must be >= 1")
    if not 1 <= args.topk <= 100:
        ap.error("--topk must be between 1 and 100")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    retriever = load_retriever(args.index, args.corpus, encoder=args.encoder, kind=args.kind, mmap=args.mmap,
                               gpu=args.gpu, device=args.device)
    cfg = ServerConfig(default_topk=args.topk, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms)
    serve(create_app(retriever, cfg), args.host, args.port, args.threads)


if __name__ == "__main__":
    main()
