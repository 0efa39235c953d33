"""An index folder and the contract every index kind keeps.

An index folder (written by ``python -m retrieval.build``) holds ``manifest.json`` (kind, count, corpus
path and fingerprint, and what the kind adds), ``offsets.npy`` (corpus row offsets) and the kind's own
files. This module reads and writes the manifest, checks that a corpus is the one indexed, names what a
server serves (:func:`identity_of`), and holds the helpers every kind's builder shares.

:class:`IndexKind` is the contract: a builder that writes a folder, a loader that opens one, and
optionally a loader for released files without a manifest. The kinds are registered in
:mod:`retrieval.kinds`, the one list of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from retrieval.corpus import CorpusStore
from retrieval.flags import opt

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class IndexKind:
    """One kind of index: how to build a folder of it, open it, and (maybe) open released files.

    - ``build(corpus, out, options: BuildOptions) -> Path``: writes the folder, its manifest last;
    - ``open_folder(folder, manifest, store, load: LoadConfig)``: the index object of a built folder;
    - ``open_files(path, store, load: LoadConfig)``: the index object of files without a manifest (a
      released ``e5_Flat.index``, a Lucene folder), or None when the kind has none;
    - ``needs_encoder``: queries are encoded to vectors (the retriever passes vectors, not text).

    An index object has ``ntotal`` and ``search(queries_or_vectors, k) -> (scores, ids)`` (rows of the
    corpus; -1 where fewer than k)."""

    name: str
    summary: str
    build: Callable
    open_folder: Callable
    open_files: Optional[Callable] = None
    needs_encoder: bool = False


@dataclass(frozen=True)
class BuildOptions:
    """How a kind's builder builds (each kind reads what it uses); each field is a flag of
    ``python -m retrieval.build`` (:class:`~retrieval.settings.BuildSettings` adds what is built)."""

    encoder: str = opt("minilm", "minilm (offline default), e5, or any HF encoder path/id")
    factory: str = opt("Flat", "FAISS factory string: Flat, HNSW64, IVF4096,PQ64 ...; wiki-18 on one GPU: "
                               "IVF65536,PQ64 (with --train-size 2621440)")
    batch_size: int = opt(256, "passages per encoder call")
    max_length: int = opt(256, "tokens per passage")
    pooling: Optional[str] = opt(None, "the encoder's pooling (default: the encoder's own)", choices=["mean", "cls"])
    device: Optional[str] = opt(None, "encoder device (default: cuda if available)")
    limit: Optional[int] = opt(None, "index only the first N passages")
    progress: bool = True  # progress bars (no flag: the command always shows them)
    strict: bool = opt(False, "duplicate passage ids are an error (default: a warning)")
    train_size: int = opt(262144, "vectors sampled to train an IVF/PQ index (faiss wants >= 39 per IVF list)")
    nprobe: int = opt(32, "IVF lists searched per query (stored in the index)")
    recall_sample: int = opt(1000, "after an approximate build, recall@1/@10 vs exact search over this many "
                                   "stored vectors (printed, in manifest.json); 0 = skip")


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def folder_manifest(kind: str, corpus: str, store: CorpusStore, n: int, **extra) -> dict:
    """The manifest fields every kind writes (then its own)."""
    from retrieval.corpus import fingerprint

    return {"kind": kind, **extra, "count": n, "corpus": str(Path(corpus).resolve()),
            "fingerprint": fingerprint(corpus, len(store))}


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


def manifest_identity(manifest: dict) -> dict:
    """An index folder's identity: its manifest as written by the build, without the corpus's absolute path
    and the build's duration (the same index copied to another node or folder keeps it, and so does an
    exact index built again from the same corpus and encoder; an approximate one built again has other
    recall figures)."""
    return {"manifest": {k: v for k, v in manifest.items() if k not in ("corpus", "encode_seconds")}}


def files_identity(kind: str, index: Path, store: CorpusStore, encoder: Optional[str]) -> dict:
    """An index without a manifest (a released ``e5_Flat.index``, a Lucene folder): the sizes of its files,
    the encoder and the corpus fingerprint (all cheap to read at start)."""
    from retrieval.corpus import fingerprint

    files = [[p.name, p.stat().st_size] for p in sorted(index.iterdir()) if p.is_file()] if index.is_dir() else \
        [["", index.stat().st_size]]  # a lone file: its size (a copy under another name is the same index)
    return {"kind": kind, "encoder": encoder, "files": files,
            "corpus": fingerprint(store.path, len(store))}


class BuildError(ValueError):
    """The corpus or the index directory cannot be used; the message names the file."""


def open_corpus(corpus: str, out_dir: Path, limit: int | None, progress: bool) -> tuple[CorpusStore, int]:
    store = CorpusStore(corpus, out_dir / "offsets.npy", progress=progress)
    n = len(store) if limit is None else min(limit, len(store))
    if n == 0:
        raise BuildError(f"{corpus}: the corpus has no passages (empty, or blank lines only)")
    return store, n


def scan(store: CorpusStore, n: int, *, strict: bool = False, progress: bool = True,
         keep_contents: bool = False) -> list[str] | None:
    """Read every row once before any encoding: a malformed row fails now, naming its line (not hours
    into the encoding). Duplicate passage ids: a warning with the count, an error with ``strict``.
    With ``keep_contents``, returns the rows' ``contents`` (the BM25 build needs them: one pass)."""
    ids = np.empty(n, dtype=np.int64)
    contents: list[str] | None = [] if keep_contents else None
    from tqdm import tqdm

    for row in tqdm(range(n), desc="checking corpus", unit="psg", disable=not progress):
        doc = store.get(row)
        ids[row] = hash(doc["id"])
        if contents is not None:
            contents.append(doc["contents"])
    dup = n - len(np.unique(ids))
    if dup:
        msg = f"{store.path}: {dup} passages repeat an id used earlier in the file"
        if strict:
            raise BuildError(msg + " (--strict)")
        print(f"warning: {msg}; results are still returned by row, but ids are ambiguous", flush=True)
    return contents
