"""Build an index directory from a wiki-18-format corpus.

    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/minilm            # dense
    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/bm25 --kind bm25
    python -m retrieval.build --corpus data/corpus.jsonl --out runs/index/lucene --kind lucene   # pyserini
    python -m retrieval.build --corpus wiki-18.jsonl --out idx/e5 --encoder intfloat/e5-base-v2 --factory HNSW64
    python -m retrieval.build --corpus wiki-18.jsonl --out idx/e5_ivfpq --encoder intfloat/e5-base-v2 \
        --factory IVF65536,PQ64 --train-size 2621440      # fits one GPU (faiss-gpu, served with --gpu)

``--kind`` picks one of the registered kinds (:mod:`retrieval.kinds`); its builder writes the folder:
``manifest.json`` (kind, count, corpus path and fingerprint, and the kind's own fields), ``offsets.npy``
(corpus row offsets) and ``index.faiss`` (dense, :mod:`retrieval.dense_build`: streamed, resumable, recall
printed for an approximate factory), ``bm25/`` (bm25s) or ``lucene/`` (pyserini's indexer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retrieval.corpus import CorpusError
from retrieval.folder import BuildError, BuildOptions
from retrieval.kinds import KINDS


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m retrieval.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="wiki-18-format jsonl")
    ap.add_argument("--out", required=True, help="index directory to write")
    ap.add_argument("--kind", choices=list(KINDS), default="dense",
                    help="; ".join(f"{k.name}: {k.summary}" for k in KINDS.values()))
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
    options = BuildOptions(encoder=args.encoder, factory=args.factory, batch_size=args.batch_size,
                           max_length=args.max_length, pooling=args.pooling, device=args.device, limit=args.limit,
                           strict=args.strict, train_size=args.train_size, nprobe=args.nprobe,
                           recall_sample=args.recall_sample)
    try:
        out = KINDS[args.kind].build(args.corpus, args.out, options)
    except (CorpusError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    print(f"index written to {out}")


if __name__ == "__main__":
    main()
