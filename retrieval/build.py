"""Build an index directory from a wiki-18-format corpus.

    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/minilm            # dense
    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/bm25 --kind bm25
    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/lucene --kind lucene   # pyserini
    python -m retrieval.build --corpus wiki-18.jsonl --out idx/e5 --encoder intfloat/e5-base-v2 --factory HNSW64
    python -m retrieval.build --corpus wiki-18.jsonl --out idx/e5_ivfpq --encoder intfloat/e5-base-v2 \
        --factory IVF65536,PQ64 --train-size 2621440      # fits one GPU (faiss-gpu, served with --gpu)

Dense builds stream the corpus in batches (progress bar) into an on-disk float32 memmap, so
memory stays bounded; an interrupted build resumes from the last finished batch. The index
directory gets ``manifest.json`` (kind, encoder spec, dim, count, corpus path, factory),
``offsets.npy`` (corpus row offsets) and ``index.faiss``, ``bm25/`` (bm25s) or ``lucene/`` (a Lucene
index built by pyserini's indexer, Anserini's ``IndexCollection``, the way Search-R1's wiki-18 BM25
index was made: docids are corpus row numbers).

After building an approximate index (anything but ``Flat``) it prints ``recall@1/@10 vs exact`` over a
sample of the stored vectors (``--recall-sample``, :mod:`retrieval.recall`) and stores it in the manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from retrieval.corpus import CorpusError, CorpusStore, content_sha256, fingerprint
from retrieval.index import MANIFEST, BM25Index, DenseIndex

PROGRESS = "progress.json"


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


def _read_progress(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict):
            raise ValueError("not an object")
        return state
    except (ValueError, UnicodeDecodeError) as e:
        print(f"warning: {path} is unreadable ({e}); encoding starts over", flush=True)
        return {}


def _tail_sha(emb: np.ndarray, start: int, end: int) -> str:
    return hashlib.sha256(np.ascontiguousarray(emb[start:end]).tobytes()).hexdigest()


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def build_dense(corpus: str, out: str, *, encoder: str = "minilm", factory: str = "Flat", batch_size: int = 256,
                max_length: int = 256, pooling: str | None = None, device: str | None = None,
                limit: int | None = None, progress: bool = True, strict: bool = False,
                train_size: int = 262144, nprobe: int = 32, recall_sample: int = 1000) -> Path:
    from retrieval.encoder import Encoder, spec_for

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store, n = open_corpus(corpus, out_dir, limit, progress)
    scan(store, n, strict=strict, progress=progress)
    spec = spec_for(encoder, max_length=max_length, pooling=pooling)
    enc = Encoder(spec, device=device)
    emb_path = out_dir / "embeddings.f32"
    state_path = out_dir / PROGRESS
    state = _read_progress(state_path)
    # The resume key: the corpus content (an edited passage changes it), the rows and the encoder.
    key = {"corpus": str(Path(corpus).resolve()), "sha256": content_sha256(corpus, progress=progress), "n": n,
           "dim": enc.dim, "encoder": spec.to_dict()}
    done = int(state.get("done", 0)) if state.get("key") == key else 0
    if state and state.get("key") != key and state.get("done"):
        print(f"note: {state_path} is for another corpus or encoder; encoding starts over", flush=True)
    if done:  # trust the vectors on disk, not progress.json: size and the last batch's checksum
        expected = n * enc.dim * 4
        size = emb_path.stat().st_size if emb_path.is_file() else -1
        tail = state.get("tail")
        if size != expected:
            print(f"note: {emb_path} is {max(size, 0)} bytes, expected {expected}; encoding starts over", flush=True)
            done = 0
        elif not tail or _tail_sha(np.memmap(emb_path, dtype=np.float32, mode="r", shape=(n, enc.dim)),
                                   tail[0], tail[1]) != tail[2]:
            print(f"note: the vectors in {emb_path} do not match {state_path}; encoding starts over", flush=True)
            done = 0
    mode = "r+" if done else "w+"
    emb = np.memmap(emb_path, dtype=np.float32, mode=mode, shape=(n, enc.dim))
    t0 = time.perf_counter()
    with tqdm(total=n, initial=done, unit="psg", desc="encoding", disable=not progress) as bar:
        for start in range(done, n, batch_size):
            rows = range(start, min(start + batch_size, n))
            texts = [store.get(r)["contents"] for r in rows]
            emb[start: start + len(texts)] = enc.encode(texts, is_query=False)
            done = start + len(texts)
            emb.flush()
            _write_json(state_path, {"key": key, "done": done, "tail": [start, done, _tail_sha(emb, start, done)]})
            bar.update(len(texts))
    encode_s = time.perf_counter() - t0
    index = DenseIndex.build(factory, np.asarray(emb), train_size=train_size, nprobe=nprobe)
    index.save(out_dir / "index.faiss")
    manifest = {
        "kind": "dense", "encoder": spec.to_dict(), "dim": enc.dim, "count": n, "factory": factory,
        "corpus": str(Path(corpus).resolve()), "fingerprint": fingerprint(corpus, len(store)),
        "encode_seconds": round(encode_s, 3),
    }
    if recall_sample > 0 and not index.exact and n > 1:
        manifest["recall"] = measure_recall(index, emb, recall_sample)
    _write_json(out_dir / MANIFEST, manifest)
    del emb
    return out_dir


def measure_recall(index: DenseIndex, emb: np.ndarray, sample: int) -> dict:
    """recall@1 and @10 of the built ``index`` against exact search over ``emb`` (printed)."""
    from retrieval.recall import recall_vs_exact

    t0 = time.perf_counter()
    recall = {**recall_vs_exact(index, emb, sample=sample, ks=(1, 10)), "nprobe": index.nprobe,
              "queries": "stored passage vectors, each one's own row left out"}
    at = {k: v for k, v in recall.items() if k.startswith("at_")}
    print(f"recall@{'/@'.join(k[3:] for k in at)} vs exact: {' / '.join(f'{v:.3f}' for v in at.values())} "
          f"({recall['sample']} stored vectors as queries, own rows left out; nprobe {index.nprobe}; "
          f"{time.perf_counter() - t0:.1f} s)", flush=True)
    return recall


def build_bm25(corpus: str, out: str, *, limit: int | None = None, progress: bool = True,
               strict: bool = False) -> Path:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store, n = open_corpus(corpus, out_dir, limit, progress)
    texts = scan(store, n, strict=strict, progress=progress, keep_contents=True)
    BM25Index.build(texts).save(out_dir / "bm25")
    _write_json(out_dir / MANIFEST, {"kind": "bm25", "count": n, "corpus": str(Path(corpus).resolve()),
                                     "fingerprint": fingerprint(corpus, len(store))})
    return out_dir


#: Run in a child process: Anserini's indexer starts a JVM in the process that calls it.
_LUCENE_INDEXER = """
import sys
from retrieval.index import java_for_pyserini
java_for_pyserini()
import pyserini.pyclass  # noqa: F401  (puts Anserini's jar on the JVM's classpath)
from jnius import autoclass
autoclass("io.anserini.index.IndexCollection").main(sys.argv[1:])
"""


def build_lucene(corpus: str, out: str, *, limit: int | None = None, progress: bool = True, strict: bool = False,
                 threads: int = 1) -> Path:
    """A Lucene BM25 index of ``corpus`` with pyserini's indexer (the ``lucene`` extra), served by
    ``retrieval.server`` as ``kind=lucene``."""
    import shutil
    import subprocess
    import tempfile

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store, n = open_corpus(corpus, out_dir, limit, progress)
    texts = scan(store, n, strict=strict, progress=progress, keep_contents=True)
    lucene = out_dir / "lucene"
    if lucene.exists():
        shutil.rmtree(lucene)
    with tempfile.TemporaryDirectory(prefix="lucene_docs_", dir=out_dir) as tmp:
        with open(Path(tmp) / "docs.jsonl", "w", encoding="utf-8") as f:
            for i, text in enumerate(texts):  # docid = corpus row: what LuceneIndex hands back
                f.write(json.dumps({"id": str(i), "contents": text}, ensure_ascii=False) + "\n")
        args = ["-collection", "JsonCollection", "-input", tmp, "-index", str(lucene),
                "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-storeRaw"]
        env = {**os.environ, "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "dummy")}
        root = Path(__file__).resolve().parent.parent
        proc = subprocess.run([sys.executable, "-c", _LUCENE_INDEXER, *args], cwd=root, env=env,
                              capture_output=True, text=True)
    if proc.returncode != 0 or not any(lucene.glob("segments_*")):
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        raise BuildError(f"pyserini's Lucene indexer failed (rc {proc.returncode}):\n{tail}")
    _write_json(out_dir / MANIFEST, {"kind": "lucene", "count": n, "corpus": str(Path(corpus).resolve()),
                                     "fingerprint": fingerprint(corpus, len(store))})
    return out_dir


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m retrieval.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="wiki-18-format jsonl")
    ap.add_argument("--out", required=True, help="index directory to write")
    ap.add_argument("--kind", choices=["dense", "bm25", "lucene"], default="dense")
    ap.add_argument("--encoder", default="minilm", help="minilm (offline default), e5, or any HF encoder path/id")
    ap.add_argument("--factory", default="Flat", help="FAISS factory string: Flat, HNSW64, IVF4096,PQ64 ...; "
                    "wiki-18 on one GPU: IVF65536,PQ64 (with --train-size 2621440)")
    ap.add_argument("--train-size", type=int, default=262144,
                    help="vectors sampled to train an IVF/PQ index (faiss wants >= 39 per IVF list)")
    ap.add_argument("--nprobe", type=int, default=32, help="IVF lists searched per query (stored in the index)")
    ap.add_argument("--recall-sample", type=int, default=1000,
                    help="after an approximate build, recall@1/@10 vs exact search over this many stored vectors "
                         "(printed, in manifest.json); 0 = skip")
    ap.add_argument("--pooling", choices=["mean", "cls"], default=None)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit", type=int, default=None, help="index only the first N passages")
    ap.add_argument("--strict", action="store_true", help="duplicate passage ids are an error (default: a warning)")
    args = ap.parse_args(argv)
    if not Path(args.corpus).is_file():
        ap.error(f"--corpus: file not found: {args.corpus}")
    if args.batch_size < 1:
        ap.error("--batch-size must be >= 1")
    if args.train_size < 1 or args.nprobe < 1 or args.recall_sample < 0:
        ap.error("--train-size and --nprobe must be >= 1, --recall-sample >= 0")
    try:
        if args.kind == "bm25":
            out = build_bm25(args.corpus, args.out, limit=args.limit, strict=args.strict)
        elif args.kind == "lucene":
            out = build_lucene(args.corpus, args.out, limit=args.limit, strict=args.strict)
        else:
            out = build_dense(args.corpus, args.out, encoder=args.encoder, factory=args.factory,
                              batch_size=args.batch_size, max_length=args.max_length, pooling=args.pooling,
                              device=args.device, limit=args.limit, strict=args.strict, train_size=args.train_size,
                              nprobe=args.nprobe, recall_sample=args.recall_sample)
    except (CorpusError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    print(f"index written to {out}")


if __name__ == "__main__":
    main()
