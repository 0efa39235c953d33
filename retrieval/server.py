"""Search-R1 compatible retrieval server: what to serve, the app, waitress, until SIGTERM.

    python -m retrieval.server --index runs/index/minilm                 # 127.0.0.1:8000
    python -m retrieval.server --index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2 --gpu
    python -m retrieval.launch e5 --wiki18 /data/wiki18                 # the same, as a named preset

``POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}`` ->
``{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}`` (without
``score`` when ``return_scores`` is false). ``GET /health``.

Concurrent requests are merged into batches: one encoder call and one index search per batch, on one
thread that owns the encoder and the index (:mod:`retrieval.batching`). A query asked before is answered
from a bounded cache (``--cache-mb``; counters on ``/health``). ``--rerank MODEL`` reranks
``--rerank-depth`` passages per query with a cross-encoder (:mod:`retrieval.rerank`). Every flag below is
a field of :mod:`retrieval.settings`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from retrieval.errors import UserError, exit_on_error
from retrieval.flags import add_flags, from_args
from retrieval.settings import LoadConfig, ServeConfig, ServerConfig

Configs = tuple[LoadConfig, ServerConfig, ServeConfig]


def parser(overrides: Optional[dict] = None) -> argparse.ArgumentParser:
    """The flags of the three settings classes. ``overrides``: class -> {field: value} replacing the
    command line's defaults (the presets of ``python -m retrieval.launch``; the user's flags still win)."""
    ap = argparse.ArgumentParser(prog="python -m retrieval.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    overrides = overrides or {}
    add_flags(ap, LoadConfig, "what is served", overrides.get(LoadConfig))
    add_flags(ap, ServerConfig, "requests, batching and cache", overrides.get(ServerConfig))
    add_flags(ap, ServeConfig, "where it is served", overrides.get(ServeConfig))
    return ap


def parse(argv=None, overrides: Optional[dict] = None) -> Configs:
    """The settings ``argv`` describes, each checked (a problem exits 2 naming its flag)."""
    ap = parser(overrides)
    args = ap.parse_args(argv)
    configs = tuple(from_args(cls, args) for cls in (LoadConfig, ServerConfig, ServeConfig))
    problems = [p for c in configs for p in c.problems()]
    if problems:
        ap.error("; ".join(problems))
    return configs  # type: ignore[return-value]


#: libgomp's spin before an idle OpenMP thread sleeps (its default: 300,000): long enough to bridge the gaps
#: between the parallel regions of one encoder call, short enough that the threads stop spinning soon after a
#: batch and leave the cores to the request and waitress threads that answer it. Read when torch loads; set
#: yours to override. ``python bench/bench_retrieval.py --parts versus`` measures the server with it.
GOMP_SPINCOUNT = "30000"


def serve(load: LoadConfig, server_cfg: ServerConfig, serve_cfg: ServeConfig) -> None:
    """Load what ``load`` names on the batching thread and serve it until SIGTERM/SIGINT. A load that fails
    for a reason the user can fix (a missing file, a GPU torch cannot use, ...) raises :class:`UserError`."""
    import os

    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)  # before torch is imported (on the batching thread)
    if not logging.getLogger().handlers:  # the lifecycle (serving on, draining, stopped) is logged at INFO
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("retrieval").setLevel(logging.INFO)
    from retrieval.app import create_app
    from retrieval.index import LOAD_ERRORS, load_configured
    from retrieval.serving import Server

    try:  # loaded by the thread that searches: no other thread of this process runs torch
        app = create_app(config=server_cfg, load=lambda: load_configured(load))
    except LOAD_ERRORS as e:
        raise UserError(str(e)) from None
    Server(app, serve_cfg).run_until_signal()


@exit_on_error
def main(argv=None) -> int:
    """Exit status: 0 stopped by a signal, 2 bad flags or what they name cannot be served."""
    serve(*parse(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
