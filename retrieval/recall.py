"""Recall of an approximate index (IVF-PQ, HNSW, ...) against exact search over the same vectors.

What ``python -m retrieval.build`` prints after building a non-flat index, and stores in its manifest:
a fixed sample of the stored passage vectors is searched as queries, once exactly (inner product over
every vector, :func:`exact_topk`, chunk by chunk from the memory map) and once with the built index;
``recall@k`` is the mean share of the exact top k that the index's top k holds. Each query's own row is
left out of both lists (a passage is its own best match, which would flatter the index), so the figure
is about its neighbours. Real queries (e5's ``query: `` prefix) sit elsewhere in the space: this is a
check of the index against its own vectors, not of retrieval quality.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def sample_rows(n: int, sample: int, seed: int = 0) -> np.ndarray:
    """``min(sample, n)`` distinct rows of ``n``, sorted, the same for the same arguments."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, min(sample, n), replace=False))


def exact_topk(vectors: np.ndarray, queries: np.ndarray, k: int, *, chunk_rows: int = 1 << 18):
    """``(scores, ids)`` of the exact inner-product top ``k`` of ``queries`` over ``vectors`` (a memmap
    is read ``chunk_rows`` at a time: bounded memory)."""
    from retrieval.dense import import_faiss

    faiss = import_faiss()
    q = np.ascontiguousarray(queries, dtype=np.float32)
    heap = faiss.ResultHeap(len(q), k, keep_max=True)
    flat = faiss.IndexFlatIP(q.shape[1])
    for lo in range(0, len(vectors), chunk_rows):
        flat.reset()
        flat.add(np.ascontiguousarray(vectors[lo: lo + chunk_rows], dtype=np.float32))
        s, i = flat.search(q, min(k, flat.ntotal))
        heap.add_result(s, np.where(i >= 0, i + lo, -1))
    heap.finalize()
    return heap.D, heap.I


def drop_rows(ids: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    """Each query's ids without its own row, the first ``k`` of them."""
    return np.stack([r[r != row][:k] for r, row in zip(ids, rows)])


def recall_vs_exact(index, vectors: np.ndarray, *, sample: int = 1000, ks: Sequence[int] = (1, 10),
                    seed: int = 0, chunk_rows: int = 1 << 18) -> dict:
    """``{"sample", "at_1", "at_10", ...}``: recall@k of ``index`` (anything with ``search(q, k)``)
    against exact search over ``vectors``, the vectors it holds."""
    n = len(vectors)
    rows = sample_rows(n, sample, seed)
    ks = sorted({min(int(k), n - 1) for k in ks if k >= 1} - {0})
    if not ks:
        raise ValueError(f"recall needs at least 2 vectors, got {n}")
    kmax = max(ks)
    q = np.ascontiguousarray(vectors[rows], dtype=np.float32)
    exact = drop_rows(exact_topk(vectors, q, kmax + 1, chunk_rows=chunk_rows)[1], rows, kmax)
    got = drop_rows(index.search(q, kmax + 1)[1], rows, kmax)
    out = {"sample": int(len(rows))}
    for k in ks:
        hits = [len(set(g[:k][g[:k] >= 0]) & set(e[:k])) for g, e in zip(got, exact)]
        out[f"at_{k}"] = round(float(np.mean(hits)) / k, 4)
    return out
