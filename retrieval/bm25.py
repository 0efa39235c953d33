"""The BM25 index kind: bm25s (embedded, the default sparse index), stemmed English, stopwords out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from retrieval.folder import BuildOptions, folder_manifest, open_corpus, scan, write_json


class BM25Index:
    def __init__(self, retriever, stemmer):
        self.retriever = retriever
        self.stemmer = stemmer

    @staticmethod
    def _stemmer():
        import Stemmer

        return Stemmer.Stemmer("english")

    @staticmethod
    def build(texts: Sequence[str]) -> "BM25Index":
        import bm25s

        stemmer = BM25Index._stemmer()
        tokens = bm25s.tokenize(list(texts), stopwords="en", stemmer=stemmer, show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return BM25Index(retriever, stemmer)

    def save(self, path: str | os.PathLike) -> None:
        self.retriever.save(str(path))

    @staticmethod
    def load(path: str | os.PathLike, *, mmap: bool = True) -> "BM25Index":
        import bm25s

        return BM25Index(bm25s.BM25.load(str(path), mmap=mmap), BM25Index._stemmer())

    @property
    def ntotal(self) -> int:
        return int(self.retriever.scores["num_docs"])

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        import bm25s

        tokens = bm25s.tokenize(list(queries), stopwords="en", stemmer=self.stemmer, show_progress=False)
        k = min(k, self.ntotal)
        ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return scores.astype(np.float32), ids.astype(np.int64)


def build_bm25(corpus: str, out: str, *, limit: int | None = None, progress: bool = True,
               strict: bool = False) -> Path:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store, n = open_corpus(corpus, out_dir, limit, progress)
    texts = scan(store, n, strict=strict, progress=progress, keep_contents=True)
    BM25Index.build(texts).save(out_dir / "bm25")
    write_json(out_dir / "manifest.json", folder_manifest("bm25", corpus, store, n))
    return out_dir


def build_folder(corpus: str, out: str, o: BuildOptions) -> Path:
    return build_bm25(corpus, out, limit=o.limit, progress=o.progress, strict=o.strict)


def open_folder(folder: Path, manifest: dict, store, load) -> BM25Index:
    return BM25Index.load(folder / "bm25")
