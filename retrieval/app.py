"""The retrieval server's Flask app: the Search-R1 HTTP contract over a :class:`~retrieval.batching.MicroBatcher`.

``POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`` (without ``score`` when
``return_scores`` is false). ``GET /health``: status, index, batching and cache counters, clients.

:func:`create_app` is the factory; the app's state (settings, batcher, counters) is one
:class:`ServerState` in ``app.extensions["retrieval"]`` (:func:`state_of`). Request threads parse, wait and
answer; every search runs on the batcher's own thread.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from retrieval.batching import MicroBatcher, SearchTimeout
from retrieval.settings import ServerConfig

log = logging.getLogger("retrieval.server")

#: client addresses counted one by one on /health (more are counted together as "other")
MAX_CLIENTS_SHOWN = 256


class BadRequest(Exception):
    """The client's request is wrong (HTTP 4xx: 400, or 415 for a body that is not JSON); the message says how."""

    def __init__(self, message: str, status: int = 400):
        if not 400 <= status < 500:
            raise ValueError(f"BadRequest is a client error (4xx), not {status}")
        super().__init__(message)
        self.message, self.status = message, status


class NotServing(Exception):
    """The server cannot search now: its batching thread is not running (HTTP 503; restart the server)."""


@dataclass
class ServerState:
    """What one app holds: its settings, its batcher, what it serves (named), and its counters."""

    config: ServerConfig
    batcher: MicroBatcher
    index_id: str
    in_flight: int = 0
    clients: dict = field(default_factory=dict)  # /retrieve requests per client address
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count_client(self, addr: str) -> None:
        with self.lock:
            if addr in self.clients or len(self.clients) < MAX_CLIENTS_SHOWN:
                self.clients[addr] = self.clients.get(addr, 0) + 1
            else:
                self.clients["other"] = self.clients.get("other", 0) + 1

    def close(self) -> None:
        self.batcher.close()


def state_of(app: Flask) -> ServerState:
    return app.extensions["retrieval"]


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


def create_app(retriever=None, config: Optional[ServerConfig] = None, *, load: Optional[Callable] = None) -> Flask:
    """The Flask app over ``retriever``, or over what ``load()`` returns, run on the batching thread (what
    ``python -m retrieval.server`` does: see :class:`~retrieval.batching.MicroBatcher`). Starts the batching
    thread; ``state_of(app).close()`` stops it."""
    from retrieval.folder import identity_of, index_id

    cfg = config or ServerConfig()
    batcher = MicroBatcher(retriever, cfg, load=load)  # checks cfg (ValueError) before anything is served
    app = Flask("retrieval")
    app.config["MAX_CONTENT_LENGTH"] = cfg.max_body_bytes
    retriever = batcher.retriever
    # what this server serves, named (replicas on several nodes must agree: scripts/multinode.sh compares it)
    state = ServerState(cfg, batcher, index_id(identity_of(retriever)))
    app.extensions["retrieval"] = state

    @app.before_request
    def _count_in():
        with state.lock:
            state.in_flight += 1

    @app.teardown_request
    def _count_out(exc=None):
        with state.lock:
            state.in_flight -= 1

    @app.errorhandler(BadRequest)
    def _bad(e: BadRequest):
        return jsonify(error=e.message), e.status

    @app.errorhandler(NotServing)
    def _not_serving(e: NotServing):
        return jsonify(error=str(e)), 503

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
                    index_id=state.index_id, batches=batcher.batches, queries=batcher.queries,
                    largest_batch=batcher.largest_batch, repeated_in_batch=batcher.repeated_in_batch,
                    cache=batcher.cache.stats(), clients=dict(state.clients))
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
        state.count_client(request.remote_addr or "unknown")
        if not batcher.alive:
            raise NotServing(f"the batching thread is not running ({batcher.error or 'stopped'}); restart the server")
        results = batcher.search(queries, topk, timeout=cfg.request_timeout_s)
        if return_scores:
            out = [[{"document": doc, "score": score} for doc, score in r] for r in results]
        else:
            out = [[doc for doc, _ in r] for r in results]
        return jsonify(result=out)

    return app
