"""The index kinds, in one registry: the build, the server, the loader and the presets read it.

========  ==========================================================  ==========================
kind      what it is                                                  module
========  ==========================================================  ==========================
dense     FAISS over encoder vectors: Flat (exact), HNSW, IVF, IVF-PQ  :mod:`retrieval.dense`
          (the factory string picks; ``--gpu``: flat in torch, IVF
          in faiss-gpu)
bm25      bm25s, embedded (the default sparse index)                  :mod:`retrieval.bm25`
lucene    pyserini's Lucene BM25 (Search-R1's prebuilt wiki-18)       :mod:`retrieval.lucene`
========  ==========================================================  ==========================

A new kind is one module that keeps the :class:`~retrieval.folder.IndexKind` contract (a builder, a
folder loader, an index object with ``ntotal`` and ``search``) and one entry in :data:`KINDS` below:
``python -m retrieval.build --kind``, ``python -m retrieval.server --kind``, :func:`retrieval.index.load_retriever`
and the presets of :mod:`retrieval.presets` take it from here.
"""

from __future__ import annotations

from retrieval import bm25, dense, dense_build, lucene
from retrieval.folder import IndexKind

KINDS: dict[str, IndexKind] = {k.name: k for k in (
    IndexKind("dense", "FAISS over encoder vectors (Flat, HNSW, IVF, IVF-PQ: --factory)",
              build=dense_build.build_folder, open_folder=dense.open_folder, open_files=dense.open_file,
              needs_encoder=True),
    IndexKind("bm25", "BM25 with bm25s (embedded)", build=bm25.build_folder, open_folder=bm25.open_folder),
    IndexKind("lucene", "BM25 with pyserini's Lucene (the lucene extra)", build=lucene.build_folder,
              open_folder=lucene.open_folder, open_files=lucene.open_dir),
)}


def kind(name: str) -> IndexKind:
    """The registered kind ``name``; an unknown one names the known ones."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown index kind {name!r}; the kinds are {', '.join(KINDS)} "
                         f"(retrieval/kinds.py)") from None
