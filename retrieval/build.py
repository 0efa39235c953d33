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

from retrieval.corpus import CorpusError
from retrieval.errors import UserError, exit_on_error
from retrieval.flags import add_flags, from_args
from retrieval.folder import BuildError
from retrieval.settings import BuildSettings


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m retrieval.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(ap, BuildSettings, "what is built, and how")
    return ap


def parse(argv=None) -> BuildSettings:
    """The build ``argv`` describes, checked (a problem exits 2 naming its flag)."""
    ap = parser()
    settings = from_args(BuildSettings, ap.parse_args(argv))
    problems = settings.problems()
    if problems:
        ap.error("; ".join(problems))
    return settings


def build(settings: BuildSettings) -> str:
    """Build the folder ``settings`` describes with its kind's builder; returns its path. A corpus or build
    problem raises :class:`UserError`."""
    from retrieval.kinds import KINDS

    try:
        return str(KINDS[settings.kind].build(settings.corpus, settings.out, settings))
    except (CorpusError, BuildError) as e:
        raise UserError(str(e)) from None


@exit_on_error
def main(argv=None) -> int:
    """Exit status: 0 built, 2 bad flags, a missing corpus or one that fails its check."""
    print(f"index written to {build(parse(argv))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
