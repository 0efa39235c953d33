"""The retriever: encoder + index + corpus, loaded from an index folder or from released files.

:func:`load_retriever` opens an index folder (``manifest.json``: everything comes from it, the kind from
:mod:`retrieval.kinds`) or released files without one: Search-R1's ``e5_Flat.index`` plus
``wiki-18.jsonl`` (with the encoder's name), or its Lucene ``bm25/`` folder. :func:`load_configured` does
the same from the server's :class:`~retrieval.settings.LoadConfig`, a reranker included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from retrieval.corpus import CorpusError, CorpusStore
from retrieval.folder import MANIFEST, IndexLoadError, check_corpus, files_identity, manifest_identity, read_manifest
from retrieval.settings import LoadConfig


class Retriever:
    """queries -> top-k corpus rows with scores. Thread-compatible, not thread-safe: the server
    calls it from its single batching thread."""

    def __init__(self, index, corpus: CorpusStore, encoder=None, kind: str = "dense", identity: Optional[dict] = None):
        self.index, self.corpus, self.encoder, self.kind = index, corpus, encoder, kind
        if index.ntotal > len(corpus):
            raise ValueError(f"index holds {index.ntotal} vectors but corpus {corpus.path} has only {len(corpus)} rows")
        #: what two servers must share to answer alike (see :func:`identity_of`)
        self.identity = identity

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[dict, float]]]:
        if self.encoder is not None:
            scores, ids = self.index.search(self.encoder.encode(list(queries), is_query=True), k)
        else:
            scores, ids = self.index.search(queries, k)
        out = []
        for srow, irow in zip(scores, ids):
            out.append([(self.corpus.get(int(i)), float(s)) for s, i in zip(srow, irow) if i >= 0])
        return out


def load_retriever(index: str | os.PathLike, corpus: Optional[str | os.PathLike] = None, *,
                   encoder: Optional[str] = None, kind: Optional[str] = None, mmap: bool = False,
                   gpu: bool = False, device: Optional[str] = None,
                   gpu_workspace_bytes: Optional[int] = None) -> Retriever:
    """Load from an index directory (manifest) or, for released indexes, from files.

    - ``index`` a directory with ``manifest.json``: everything comes from the manifest.
    - ``index`` a ``.index`` file (e.g. Search-R1's ``e5_Flat.index``): needs ``corpus`` and
      ``encoder`` (e.g. ``intfloat/e5-base-v2``; e5 conventions follow from the name).
    - ``kind="lucene"`` with ``index`` a Lucene index directory: needs ``corpus``.
    """
    load = LoadConfig(index=str(index), corpus=None if corpus is None else str(corpus), encoder=encoder, kind=kind,
                      mmap=mmap, gpu=gpu, device=device,
                      **({"gpu_workspace_bytes": gpu_workspace_bytes} if gpu_workspace_bytes else {}))
    return _load(load)


def _load(load: LoadConfig) -> Retriever:
    from retrieval.encoder import Encoder, EncoderSpec, spec_for
    from retrieval.kinds import kind as kind_named

    index = Path(load.index)
    if index.is_dir() and (index / MANIFEST).is_file():
        m = read_manifest(index)
        store = CorpusStore(Path(load.corpus or m["corpus"]), index / "offsets.npy")
        check_corpus(m, index / MANIFEST, store)
        k = kind_named(m["kind"])
        enc = Encoder(EncoderSpec(**m["encoder"]), device=load.device) if k.needs_encoder else None
        return Retriever(k.open_folder(index, m, store, load), store, enc, kind=k.name, identity=manifest_identity(m))
    if load.corpus is None:
        raise ValueError(f"{index} has no {MANIFEST}: pass the corpus jsonl too")
    k = kind_named(load.kind or ("lucene" if index.is_dir() else "dense"))
    if k.open_files is None:
        raise IndexLoadError(f"{index} has no {MANIFEST}, and a {k.name} index is served from a folder built by "
                             f"`python -m retrieval.build --kind {k.name}`")
    store = CorpusStore(load.corpus, Path(str(index) + ".offsets.npy") if index.is_file() else index / "offsets.npy")
    opened = k.open_files(index, store, load)
    enc = Encoder(spec_for(load.encoder), device=load.device) if k.needs_encoder else None
    return Retriever(opened, store, enc, kind=k.name,
                     identity=files_identity(k.name, index, store, load.encoder if k.needs_encoder else None))


def load_configured(load: LoadConfig):
    """What ``python -m retrieval.server`` serves: the retriever of ``load``, behind a reranker if one is named."""
    retriever = _load(load)
    if load.rerank:
        from retrieval.rerank import CrossEncoder, RerankingRetriever

        reranker = CrossEncoder(load.rerank, device=load.device, batch_size=load.rerank_batch,
                                max_length=load.rerank_max_length)
        retriever = RerankingRetriever(retriever, reranker, depth=load.rerank_depth)
    return retriever


def _load_errors() -> tuple:
    from retrieval.flat import FlatIndexError, UnsupportedGPU

    return (CorpusError, IndexLoadError, FileNotFoundError, FlatIndexError, UnsupportedGPU, OSError, ValueError)


#: what a load can fail with that is the user's to fix (printed in one line, exit 2)
LOAD_ERRORS = _load_errors()
