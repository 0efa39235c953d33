"""The result cache of the retrieval server: search results kept by query text, bounded in bytes.

The samples of one GRPO question often search the same words; a text searched before is answered from
here without touching the encoder or the index (``--cache-mb``; counters on ``/health``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional


class ResultCache:
    """Search results kept by query text, least recently used out first, bounded in bytes.

    An entry holds the rows of the deepest search done for that text (``k`` rows); a request for
    ``topk <= k`` is served from its first ``topk`` rows, as a fresh search of depth ``k`` would be (the
    batcher always searches a batch at its deepest ``topk`` and cuts each request's rows). One cache
    serves one retriever: the app builds it with the batcher, so a server started on another index
    starts empty. Used by the batching thread only, so it takes no lock; ``/health`` reads its counters."""

    def __init__(self, max_bytes: int):
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
