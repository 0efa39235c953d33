"""Building a dense index folder: encode the corpus, build the FAISS index, measure its recall.

The corpus is streamed in batches (progress bar) into an on-disk float32 memmap, so memory stays
bounded; an interrupted build resumes from the last finished batch (the vectors on disk are trusted by
size and the last batch's checksum, not by ``progress.json``). After an approximate build (anything but
``Flat``) it prints ``recall@1/@10 vs exact`` over a sample of the stored vectors and stores it in the
manifest (:mod:`retrieval.recall`).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from retrieval.corpus import content_sha256, fingerprint
from retrieval.dense import DenseIndex
from retrieval.folder import BuildOptions, open_corpus, scan, write_json

PROGRESS = "progress.json"


def read_progress(path: Path) -> dict:
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


def build_dense(corpus: str, out: str, *, encoder: str = "minilm", factory: str = "Flat", batch_size: int = 256,
                max_length: int = 256, pooling: str | None = None, device: str | None = None,
                limit: int | None = None, progress: bool = True, strict: bool = False,
                train_size: int = 262144, nprobe: int = 32, recall_sample: int = 1000) -> Path:
    from tqdm import tqdm

    from retrieval.encoder import Encoder, spec_for

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store, n = open_corpus(corpus, out_dir, limit, progress)
    scan(store, n, strict=strict, progress=progress)
    spec = spec_for(encoder, max_length=max_length, pooling=pooling)
    enc = Encoder(spec, device=device)
    emb_path = out_dir / "embeddings.f32"
    state_path = out_dir / PROGRESS
    state = read_progress(state_path)
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
            write_json(state_path, {"key": key, "done": done, "tail": [start, done, _tail_sha(emb, start, done)]})
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
    write_json(out_dir / "manifest.json", manifest)
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


def build_folder(corpus: str, out: str, o: BuildOptions) -> Path:
    return build_dense(corpus, out, encoder=o.encoder, factory=o.factory, batch_size=o.batch_size,
                       max_length=o.max_length, pooling=o.pooling, device=o.device, limit=o.limit,
                       progress=o.progress, strict=o.strict, train_size=o.train_size, nprobe=o.nprobe,
                       recall_sample=o.recall_sample)
