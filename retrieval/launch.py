"""python -m retrieval.launch [PRESET] [--flags] [-- server flags]: start the retriever from a named preset.

    python -m retrieval.launch                         # minilm: bundled corpus, dense MiniLM, CPU (built once)
    python -m retrieval.launch bm25                    # bundled corpus, BM25 (bm25s)
    python -m retrieval.launch e5 --wiki18 /data/wiki18          # Search-R1's e5_Flat.index on all GPUs
    python -m retrieval.launch e5-hnsw --wiki18 /data/wiki18     # HNSW64 index (CPU)
    python -m retrieval.launch e5-cpu --wiki18 /data/wiki18      # e5_Flat.index, exact fp32, memory-mapped (CPU)
    python -m retrieval.launch e5-ivfpq --index-dir idx/e5_ivfpq # IVF-PQ built with retrieval.build, faiss-gpu
    python -m retrieval.launch lucene --wiki18 /data/wiki18      # prebuilt wiki-18 BM25 (the lucene extra)
    python -m retrieval.launch lucene --corpus data/corpus.jsonl # Lucene BM25 over a jsonl (built once)
    python -m retrieval.launch e5 --host 0.0.0.0 -- --max-batch 512 --rerank cross-encoder/ms-marco-MiniLM-L12-v2

A preset names an index kind (:mod:`retrieval.kinds`), where its files are, whether it is built here
when missing, and the server settings it needs (fields of :class:`~retrieval.settings.LoadConfig`).
Everything after ``--`` is a ``python -m retrieval.server`` flag, over the preset's settings. A missing
index is built first in a child process (``python -m retrieval.build`` with this interpreter, its progress
shown), so this process runs no torch before the server's batching thread loads the index. Exit status: 2
when the preset cannot run (a missing file or extra, a failed build), as every command
(``docs/errors.md``).
``bash retrieval_launch.sh`` is this command with its settings from the environment (``RETRIEVER``,
``HOST``, ``PORT``, ``CORPUS``, ``INDEX_ROOT``, ``WIKI18``, ``INDEX_DIR``, ``RERANK``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from retrieval.errors import UserError, exit_on_error
from retrieval.flags import to_argv
from retrieval.kinds import KINDS
from retrieval.settings import BuildSettings, LoadConfig, ServeConfig, ServerConfig


@dataclass(frozen=True)
class Where:
    """The paths a preset reads: the parsed flags."""

    corpus: Path
    corpus_given: bool
    index_root: Path
    wiki18: Path
    index_dir: Optional[Path]


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str  # a key of retrieval.kinds.KINDS
    summary: str
    #: what the server loads for these paths (LoadConfig fields), or a UserError naming what is missing
    serves: Callable[[Where], dict[str, Any]]
    #: an index folder built here when missing (its manifest absent), from --corpus, or None
    builds: Optional[Callable[[Where], Optional[Path]]] = None
    needs: Optional[tuple[str, str]] = None  # (module, the extra that brings it)


class PresetError(UserError):
    """A preset that cannot run here: a file to download or build, an extra to install (exit 2)."""

    def __init__(self, what: str, *how: str):
        super().__init__(f"{what}; " + "\n  ".join(how))


def _wiki18_file(w: Where, name: str) -> Path:
    path = w.wiki18 / name
    if not path.is_file():
        raise PresetError(f"{path} is missing", f"download it: bash scripts/download_wiki18.sh {w.wiki18}")
    return path


def _e5(index_name: str, **load: Any) -> Callable[[Where], dict[str, Any]]:
    def serves(w: Where) -> dict[str, Any]:
        return dict(index=str(_wiki18_file(w, index_name)), corpus=str(_wiki18_file(w, "wiki-18.jsonl")),
                    encoder="intfloat/e5-base-v2", **load)
    return serves


def _ivfpq(w: Where) -> dict[str, Any]:
    index = w.index_dir or w.index_root / "e5_ivfpq"
    if not (index / "manifest.json").is_file():
        raise PresetError(f"no IVF-PQ index in {index}",
                          "build it (docs/retrieval.md, An IVF-PQ index of wiki-18 for one GPU):",
                          f"python -m retrieval.build --corpus {w.wiki18}/wiki-18.jsonl --out {index} --encoder "
                          f"intfloat/e5-base-v2 --factory IVF65536,PQ64 --train-size 2621440")
    return dict(index=str(index), gpu=True)


def _lucene(w: Where) -> dict[str, Any]:
    if w.corpus_given:  # a Lucene index of that jsonl, built here
        return dict(index=str(w.index_root / "lucene"))
    if not any((w.wiki18 / "bm25").glob("segments_*")):
        raise PresetError(f"no Lucene index in {w.wiki18 / 'bm25'} (no segments_* file)",
                          f"download it: bash scripts/download_wiki18.sh {w.wiki18} corpus,bm25",
                          "(or index a jsonl: python -m retrieval.launch lucene --corpus data/corpus.jsonl)")
    return dict(kind="lucene", index=str(w.wiki18 / "bm25"), corpus=str(_wiki18_file(w, "wiki-18.jsonl")))


def _built(name: str) -> Callable[[Where], Path]:
    return lambda w: w.index_root / name


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("minilm", "dense", "the bundled corpus (or --corpus), dense MiniLM, CPU; built once (the default)",
           lambda w: dict(index=str(w.index_root / "minilm")), builds=_built("minilm")),
    Preset("bm25", "bm25", "the bundled corpus (or --corpus), BM25 with bm25s; built once",
           lambda w: dict(index=str(w.index_root / "bm25")), builds=_built("bm25")),
    Preset("e5", "dense", "Search-R1's e5_Flat.index over wiki-18, exact, on all GPUs", _e5("e5_Flat.index", gpu=True)),
    Preset("e5-cpu", "dense", "Search-R1's e5_Flat.index over wiki-18, exact fp32, memory-mapped, on CPU",
           _e5("e5_Flat.index", mmap=True)),
    Preset("e5-hnsw", "dense", "Search-R1's e5_HNSW64.index over wiki-18, on CPU", _e5("e5_HNSW64.index")),
    Preset("e5-ivfpq", "dense", "the IVF-PQ index of wiki-18 in --index-dir (built once, see docs), on faiss-gpu",
           _ivfpq),
    Preset("lucene", "lucene", "Search-R1's prebuilt wiki-18 BM25, or a Lucene index of --corpus (built once)",
           _lucene, builds=lambda w: w.index_root / "lucene" if w.corpus_given else None,
           needs=("pyserini", "lucene")),
)}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m retrieval.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", nargs="?", default="minilm", choices=list(PRESETS),
                    help="; ".join(f"{p.name}: {p.summary}" for p in PRESETS.values()))
    ap.add_argument("--host", default=ServeConfig.host, help="bind address; 0.0.0.0 for multi-node training")
    ap.add_argument("--port", type=int, default=ServeConfig.port)
    ap.add_argument("--corpus", default=None, help="the jsonl a built preset indexes (default: data/corpus.jsonl)")
    ap.add_argument("--index-root", default="runs/index", help="where built presets keep their index folders")
    ap.add_argument("--wiki18", default="data/wiki18", help="the wiki-18 download (scripts/download_wiki18.sh)")
    ap.add_argument("--index-dir", default=None, help="e5-ivfpq: the index folder (default: INDEX_ROOT/e5_ivfpq)")
    ap.add_argument("--rerank", default=None, metavar="MODEL", help="rerank with this cross-encoder (any preset)")
    return ap


@dataclass(frozen=True)
class Plan:
    """What a launch does: build ``build`` first (when set), then serve ``load``, ``server`` and ``serve``."""

    preset: Preset
    where: Where
    build: Optional[BuildSettings]
    load: LoadConfig
    server: ServerConfig
    serve: ServeConfig


def plan(argv=None) -> Plan:
    """The launch ``argv`` describes: the preset's settings, then the server flags after ``--`` over them."""
    from retrieval import server

    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    preset = PRESETS[args.preset]
    assert preset.kind in KINDS, preset
    w = Where(corpus=Path(args.corpus or "data/corpus.jsonl"), corpus_given=args.corpus is not None,
              index_root=Path(args.index_root), wiki18=Path(args.wiki18),
              index_dir=Path(args.index_dir) if args.index_dir else None)
    if preset.needs and importlib.util.find_spec(preset.needs[0]) is None:
        raise PresetError(f"the {preset.name} preset needs {preset.needs[0]}, which is not installed",
                          f"pip install -e '.[{preset.needs[1]}]'")
    folder = preset.builds(w) if preset.builds else None
    if folder is not None and (folder / "manifest.json").is_file():
        folder = None
    if folder is not None and not w.corpus.is_file():
        raise PresetError(f"the corpus {w.corpus} is missing", "pass --corpus FILE (a wiki-18-format jsonl)")
    build = BuildSettings(corpus=str(w.corpus), out=str(folder), kind=preset.kind) if folder is not None else None
    values = dict(index=str(folder)) if folder is not None else preset.serves(w)
    if args.rerank:
        values["rerank"] = args.rerank
    # the command line's defaults, the preset's settings over them, the flags after -- last
    load, server_cfg, serve_cfg = server.parse(extra, overrides={LoadConfig: values,
                                                                 ServeConfig: dict(host=args.host, port=args.port)})
    return Plan(preset, w, build, load, server_cfg, serve_cfg)


def build_in_child(build: BuildSettings) -> None:
    """``python -m retrieval.build`` for ``build``, in a child process of this interpreter (its output and
    progress shown as it goes): the build's torch threads, device memory and cuBLAS workspace end with it."""
    cmd = [sys.executable, "-m", "retrieval.build", *to_argv(build)]
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise UserError(f"building the index failed (exit {rc}): {' '.join(cmd)}")


@exit_on_error
def main(argv=None) -> int:
    """Exit status: 0 stopped by a signal, 2 a preset that cannot run or a failed build."""
    from retrieval import server

    p = plan(argv)
    if p.build is not None:
        print(f"building the {p.preset.name} index over {p.where.corpus} into {p.build.out} ...", flush=True)
        build_in_child(p.build)
    server.serve(p.load, p.server, p.serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
