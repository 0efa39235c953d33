"""Client for the retrieval server: sync and asyncio, pooled, with timeouts and retries.

Retries (exponential backoff) on connection errors, timeouts and 5xx; a 4xx is the caller's
mistake and raises :class:`RetrievalRequestError` at once; a server that stays down raises
:class:`RetrieverUnavailable` saying how to start one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Optional, Sequence

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class RetrieverUnavailable(RuntimeError):
    pass


class RetrievalRequestError(ValueError):
    pass


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
        if not isinstance(doc, dict) or "contents" not in doc:
            raise RetrievalRequestError(f"unexpected result item: {item!r}")
        out.append(doc["contents"])
    return out


class RetrievalClient:
    def __init__(self, url: str = DEFAULT_URL, *, topk: int = 3, timeout: float = 30.0, retries: int = 5,
                 backoff: float = 0.5, max_connections: int = 256):
        self.url = _endpoint(url)
        self.topk, self.timeout, self.retries, self.backoff = topk, timeout, retries, backoff
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._sync: Optional[httpx.Client] = None
        self._async: Optional[httpx.AsyncClient] = None

    def _payload(self, queries, topk, return_scores):
        if isinstance(queries, str):
            queries = [queries]
        return {"queries": list(queries), "topk": topk or self.topk, "return_scores": return_scores}

    def _handle(self, resp: httpx.Response) -> Optional[list]:
        if resp.status_code >= 500:
            return None
        if resp.status_code >= 400:
            try:
                msg = resp.json().get("error", resp.text)
            except ValueError:
                msg = resp.text
            raise RetrievalRequestError(f"retrieval server rejected the request ({resp.status_code}): {msg}")
        return resp.json()["result"]

    def _down(self, last: Exception | str) -> RetrieverUnavailable:
        return RetrieverUnavailable(
            f"retrieval server at {self.url} did not answer after {self.retries + 1} tries ({last}). "
            "Start one with `bash retrieval_launch.sh` (or `python -m retrieval.server --index DIR`).")

    def retrieve(self, queries: Sequence[str] | str, topk: Optional[int] = None, return_scores: bool = True) -> list:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout, limits=self._limits)
        payload = self._payload(queries, topk, return_scores)
        last: Exception | str = "no attempt"
        for attempt in range(self.retries + 1):
            try:
                out = self._handle(self._sync.post(self.url, json=payload))
                if out is not None:
                    return out
                last = "HTTP 5xx"
            except (httpx.TransportError,) as e:
                last = e
            if attempt < self.retries:
                time.sleep(self.backoff * 2 ** attempt)
        raise self._down(last)

    async def aretrieve(self, queries: Sequence[str] | str, topk: Optional[int] = None,
                        return_scores: bool = True) -> list:
        if self._async is None:
            self._async = httpx.AsyncClient(timeout=self.timeout, limits=self._limits)
        payload = self._payload(queries, topk, return_scores)
        last: Exception | str = "no attempt"
        for attempt in range(self.retries + 1):
            try:
                out = self._handle(await self._async.post(self.url, json=payload))
                if out is not None:
                    return out
                last = "HTTP 5xx"
            except (httpx.TransportError,) as e:
                last = e
            if attempt < self.retries:
                await asyncio.sleep(self.backoff * 2 ** attempt)
        raise self._down(last)

    def health(self) -> dict:
        resp = httpx.get(self.url[: -len("/retrieve")] + "/health", timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

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


def wait_healthy(url: str, wait: float = 0.0, interval: float = 1.0) -> bool:
    """True once ``GET /health`` answers 200 (polling for up to ``wait`` seconds)."""
    client = RetrievalClient(url, timeout=5)
    deadline = time.monotonic() + wait
    while True:
        try:
            client.health()
            return True
        except Exception:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def main(argv=None) -> int:
    """``python -m retrieval.client URL [--wait S]``: exit 0 when the server is healthy (used by the
    launch scripts), 1 otherwise."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m retrieval.client", description=main.__doc__)
    ap.add_argument("url", help="server base URL or its /retrieve endpoint")
    ap.add_argument("--wait", type=float, default=0.0, help="seconds to keep polling /health")
    args = ap.parse_args(argv)
    if args.wait < 0:
        ap.error("--wait must be >= 0")
    return 0 if wait_healthy(args.url, args.wait) else 1


if __name__ == "__main__":
    raise SystemExit(main())
