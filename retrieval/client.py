"""Client for the retrieval server: sync and asyncio, pooled, with a total deadline and retries.

Retries (exponential backoff) on connection errors, timeouts and 5xx; a 4xx is the caller's
mistake and raises :class:`RetrievalRequestError` at once. A server that cannot be reached raises
:class:`RetrieverUnavailable` saying how to start one; one that keeps answering 5xx raises
:class:`RetrievalServerError` with what it answered. ``timeout`` bounds each call in total (all
tries, including a server that trickles its answer), not each read. An answer that does not have
the documented shape raises :class:`RetrievalResponseError`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Optional, Sequence

import httpx

from retrieval.errors import RETRIEVER_FAILED

DEFAULT_URL = "http://127.0.0.1:8000"
#: Longest query the server accepts by default (``ServerConfig.max_query_chars`` in retrieval/settings.py,
#: ``--max-query-chars``); the agent loop cuts its queries to it. Here, so that a client needs no Flask import.
MAX_QUERY_CHARS = 4096


class RetrieverUnavailable(RuntimeError):
    pass


class RetrievalServerError(RuntimeError):
    """The server answered, but with a 5xx every time."""


class RetrievalRequestError(ValueError):
    pass


class RetrievalResponseError(ValueError):
    """The server's answer does not have the /retrieve schema."""


def _endpoint(url: str) -> str:
    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/retrieve") else url + "/retrieve"


def contents_of(result: Sequence[dict]) -> list[str]:
    """One query's result list -> the ``contents`` strings, in rank order."""
    out = []
    for item in result:
        doc = item.get("document", item) if isinstance(item, dict) else None
        if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
            raise RetrievalResponseError(f"unexpected result item: {item!r}"[:300])
        out.append(doc["contents"])
    return out


def check_result(body, n_queries: int, url: str) -> list:
    """The ``result`` of a /retrieve answer, checked: one list per query, each of documents (or
    ``{"document", "score"}``) with string ``contents``."""
    if not isinstance(body, dict) or "result" not in body:
        raise RetrievalResponseError(f"{url} answered without a 'result' field: {str(body)[:200]}")
    result = body["result"]
    if not isinstance(result, list) or not all(isinstance(r, list) for r in result):
        raise RetrievalResponseError(f"{url} answered a 'result' that is not a list of lists: {str(result)[:200]}")
    if len(result) != n_queries:
        raise RetrievalResponseError(f"{url} answered {len(result)} result lists for {n_queries} queries")
    for r in result:
        contents_of(r)
    return result


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        msg = body.get("error") if isinstance(body, dict) else None
    except ValueError:
        msg = None
    return (msg or resp.text or "(empty body)").strip()[:500]


class RetrievalClient:
    def __init__(self, url: str = DEFAULT_URL, *, topk: int = 3, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 0.5, max_connections: int = 256):
        self.url = _endpoint(url)
        self.topk, self.timeout, self.retries, self.backoff = topk, timeout, retries, backoff
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._async: Optional[httpx.AsyncClient] = None
        self._async_loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the sync API's private loop (own thread)
        self._loop_lock = threading.Lock()

    def _payload(self, queries, topk, return_scores):
        if isinstance(queries, str):
            queries = [queries]
        return {"queries": list(queries), "topk": topk or self.topk, "return_scores": return_scores}

    def _down(self, last) -> RetrieverUnavailable:
        return RetrieverUnavailable(
            f"retrieval server at {self.url} could not be reached after {self.retries + 1} tries ({last}). "
            "Start one with `bash retrieval_launch.sh` (or `python -m retrieval.server --index DIR`).")

    async def _attempts(self, payload: dict) -> list:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:  # httpx's pool belongs to one event loop
            self._async = httpx.AsyncClient(timeout=self.timeout, limits=self._limits)
            self._async_loop = loop
        last: object = "no attempt"
        server_said: Optional[str] = None
        for attempt in range(self.retries + 1):
            try:
                resp = await self._async.post(self.url, json=payload)
            except httpx.TransportError as e:
                last, server_said = e, None
            else:
                if resp.status_code >= 500:
                    server_said = f"HTTP {resp.status_code}: {_error_text(resp)}"
                elif resp.status_code >= 400:
                    raise RetrievalRequestError(
                        f"retrieval server rejected the request ({resp.status_code}): {_error_text(resp)}")
                else:
                    try:
                        body = resp.json()
                    except ValueError:
                        raise RetrievalResponseError(
                            f"{self.url} answered with non-JSON: {resp.text[:200]!r}") from None
                    return check_result(body, len(payload["queries"]), self.url)
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2 ** attempt)
        if server_said is not None:
            raise RetrievalServerError(f"retrieval server at {self.url} kept failing ({self.retries + 1} tries); "
                                       f"last answer: {server_said}")
        raise self._down(last)

    async def aretrieve(self, queries: Sequence[str] | str, topk: Optional[int] = None,
                        return_scores: bool = True) -> list:
        payload = self._payload(queries, topk, return_scores)
        try:
            return await asyncio.wait_for(self._attempts(payload), timeout=self.timeout)
        except asyncio.TimeoutError:
            raise RetrieverUnavailable(f"retrieval server at {self.url} gave no complete answer within "
                                       f"{self.timeout:g} s (the client's total timeout)") from None

    def _sync_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="retrieval-client", daemon=True).start()
                self._loop = loop
            return self._loop

    def retrieve(self, queries: Sequence[str] | str, topk: Optional[int] = None, return_scores: bool = True) -> list:
        """The sync API: runs :meth:`aretrieve` on the client's own event-loop thread (usable from
        any thread, inside or outside a running event loop)."""
        fut = asyncio.run_coroutine_threadsafe(self.aretrieve(queries, topk, return_scores), self._sync_loop())
        return fut.result()

    def health(self) -> dict:
        resp = httpx.get(self.url[: -len("/retrieve")] + "/health", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()

    def close(self) -> None:
        if self._loop is not None:
            if self._async is not None:
                asyncio.run_coroutine_threadsafe(self._async.aclose(), self._loop).result(timeout=5)
                self._async = None
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


class LocalRetrievalClient:
    """Same interface over an in-process :class:`retrieval.index.Retriever` (no server)."""

    def __init__(self, retriever, topk: int = 3):
        self.retriever, self.topk = retriever, topk

    def retrieve(self, queries, topk=None, return_scores=True):
        if isinstance(queries, str):
            queries = [queries]
        res = self.retriever.search(list(queries), topk or self.topk)
        return [[{"document": d, "score": s} if return_scores else d for d, s in r] for r in res]

    async def aretrieve(self, queries, topk=None, return_scores=True):
        return self.retrieve(queries, topk, return_scores)

    def close(self):
        pass

    async def aclose(self):
        pass


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child that exited but was not reaped yet is a zombie: dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait_healthy(url: str, wait: float = 0.0, interval: float = 1.0, pid: Optional[int] = None) -> bool:
    """True once ``GET /health`` answers 200 (polling for up to ``wait`` seconds); False at once
    when process ``pid`` (the server being started) has exited."""
    client = RetrievalClient(url, timeout=5)
    deadline = time.monotonic() + wait
    while True:
        try:
            client.health()
            return True
        except Exception:
            if time.monotonic() >= deadline or (pid is not None and not _alive(pid)):
                return False
            time.sleep(interval)


async def wait_healthy_async(url: str, wait: float, interval: float = 2.0, report_every: float = 30.0,
                             log=None) -> bool:
    """The asyncio form of :func:`wait_healthy` for a caller inside an event loop (the agent loop
    manager): True once ``GET /health`` answers 200 within ``wait`` seconds; ``log`` gets a line
    every ``report_every`` seconds while it waits."""
    base = _endpoint(url)[: -len("/retrieve")]
    start = time.monotonic()
    next_report = start + report_every
    last = "no answer yet"
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                resp = await client.get(base + "/health")
                if resp.status_code == 200:
                    return True
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            now = time.monotonic()
            if now - start >= wait:
                return False
            if log is not None and now >= next_report:
                log(f"still waiting for the retriever at {base} ({now - start:.0f} of {wait:g} s; last: {last})")
                next_report += report_every
            await asyncio.sleep(min(interval, max(0.0, start + wait - now)))


def main(argv=None) -> int:
    """``python -m retrieval.client URL [--wait S]``: exit 0 when the server is healthy (used by the
    launch scripts), 3 when it does not answer (``docs/errors.md``), 2 for bad flags."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m retrieval.client", description=main.__doc__)
    ap.add_argument("url", help="server base URL or its /retrieve endpoint")
    ap.add_argument("--wait", type=float, default=0.0, help="seconds to keep polling /health")
    ap.add_argument("--pid", type=int, default=None,
                    help="the server's process: stop waiting (exit 3) as soon as it has exited")
    args = ap.parse_args(argv)
    if args.wait < 0:
        ap.error("--wait must be >= 0")
    if args.pid is not None and args.pid <= 0:
        ap.error("--pid must be a process id (> 0)")
    if wait_healthy(args.url, args.wait, pid=args.pid):
        return 0
    if args.pid is not None and not _alive(args.pid):
        print(f"the retrieval server (pid {args.pid}) exited before answering at {args.url}", file=sys.stderr)
    return RETRIEVER_FAILED  # silent otherwise: scripts probe with it, then say what to start


if __name__ == "__main__":
    raise SystemExit(main())
