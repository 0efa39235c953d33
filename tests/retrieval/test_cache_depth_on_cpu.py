"""The result cache answers every request with exactly its topk rows (or all there are), however the
requests of one batch share a text and whatever depth the cache holds it at."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

from retrieval.batching import MicroBatcher
from retrieval.settings import ServerConfig

PASSAGES = 12  # the index's size: a topk above it gets all there are


class Ranked:
    """A stand-in retriever: for any text, passages 0..k-1 of a text-dependent order (so a row cut from a
    deeper search equals a fresh search's row). ``gate``: searches of the text "gate" wait for it."""

    corpus, kind = [None] * PASSAGES, "fake"

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.searched: list[tuple[list[str], int]] = []

    def search(self, queries, k):
        self.searched.append((list(queries), k))
        if "gate" in queries:
            self.entered.set()
            self.gate.wait(30)
        return [self.rows(q, k) for q in queries]

    @staticmethod
    def rows(q: str, k: int) -> list:
        order = sorted(range(PASSAGES), key=lambda i: (hash((q, i)) % 1000, i))
        return [({"id": str(i), "contents": f"{q} {i}"}, float(PASSAGES - r)) for r, i in enumerate(order[:k])]


def _batcher(retriever, cache_bytes: int) -> MicroBatcher:
    return MicroBatcher(retriever, ServerConfig(max_batch=256, cache_bytes=cache_bytes))


def test_a_deeper_request_in_the_same_batch_is_not_cut_to_the_cached_depth():
    """Two requests for one text in one batch, the shallower first, the cache holding the text at a depth
    between theirs: each gets its own topk (the deeper one used to get the cached rows: 5 of 10)."""
    fake = Ranked()
    b = _batcher(fake, 1 << 20)
    try:
        assert len(b.search(["t"], 5, timeout=30)[0]) == 5  # kept at depth 5
        fake.gate.clear()
        fake.entered.clear()
        blocker = b.submit(["gate"], 1)  # holds the batching thread: the next two queue into one batch
        assert fake.entered.wait(30)
        shallow, deep = b.submit(["t"], 3), b.submit(["t"], 10)
        fake.gate.set()
        assert blocker.result(timeout=30)
        got_shallow, got_deep = shallow.result(timeout=30)[0], deep.result(timeout=30)[0]
        assert fake.searched[-1] == (["t"], 10), fake.searched  # one batch, searched once at its depth
        assert got_shallow == Ranked.rows("t", 3)
        assert len(got_deep) == 10 and got_deep == Ranked.rows("t", 10)
        searches = len(fake.searched)
        assert b.search(["t"], 10, timeout=30)[0] == Ranked.rows("t", 10)  # now kept at 10: a hit
        assert len(fake.searched) == searches and b.cache.hits == 1
    finally:
        fake.gate.set()
        b.close()


def test_every_request_gets_exactly_its_topk_under_concurrency():
    fake = Ranked()
    b = _batcher(fake, 1 << 20)
    texts = [f"text {i}" for i in range(6)]
    rng = random.Random(0)
    requests = [([rng.choice(texts) for _ in range(rng.randint(1, 4))], rng.randint(1, PASSAGES + 4))
                for _ in range(400)]

    def ask(req):
        queries, topk = req
        return b.search(queries, topk, timeout=60)

    try:
        with ThreadPoolExecutor(16) as ex:
            answers = list(ex.map(ask, requests))
    finally:
        b.close()
    wrong = [(q, k, [len(r) for r in got]) for (q, k), got in zip(requests, answers)
             if got != [Ranked.rows(t, min(k, PASSAGES)) for t in q]]
    assert not wrong, wrong[:5]
    assert b.cache.hits > 0 and b.batches < len(requests)
