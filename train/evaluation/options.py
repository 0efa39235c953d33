"""The evaluator's arguments (``python -m train.evaluate``) and the one object they become:
:class:`EvalOptions` (what to evaluate, where the rows go) holding the
:class:`~train.inference.settings.AskSettings` every engine is built from."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from train.inference.settings import AskSettings

DESCRIPTION = """The 7-benchmark evaluation: greedy inference over a test parquet, EM/F1 per source.

    python -m train.evaluate --model CKPT --data data/processed/test.parquet [--backend vllm]
        [--method search_r1|direct|cot|rag] [--engines N] [--tensor-parallel-size K]
        [--sources nq,hotpotqa] [--limit N] [--out runs/eval/CKPT.jsonl] [--paper-row "3B-Ins GRPO+LLDS"]
    python -m train.evaluate --checkpoints CKPT_DIR --data data/processed/val_sample.parquet [--out DIR]

Per-sample results go to one jsonl (resumable: rows already there are skipped, while the model and
the settings recorded beside it in <out>.settings.json are the same; otherwise refused); the table prints EM
(and F1) per data_source and the macro average, beside the paper's numbers when a row is given. With
GPUs, one engine per GPU (--engines, default all). --method picks the Search-R1 agent or a baseline of
the paper's table (direct answer, chain of thought, RAG with the top-k passages). --checkpoints
evaluates every saved global_step_N of a run (merged to HF format on the fly), one row per step, plots
EM against step beside the training reward, and names the best step.

Exit status: 0 done; 2 bad input; 3 the retriever failed (rows so far kept: rerun the same command);
4 an engine died (rows so far kept: rerun).
"""


@dataclass(frozen=True)
class EvalOptions:
    """A run of the evaluator: the rows (``data``, ``sources``, ``limit``), where results go (``out``), the
    engines, when to stop on failed searches, and the asker's settings (``ask``; its ``model`` is the
    model evaluated, or None with ``checkpoints``)."""

    ask: AskSettings
    data: str
    checkpoints: Optional[str] = None
    engines: Optional[int] = None
    sources: Optional[tuple[str, ...]] = None
    limit: Optional[int] = None
    out: Optional[str] = None
    paper_row: Optional[str] = None
    max_failure_rate: float = 0.5
    expect_corpus: Optional[str] = None  # checked against the retriever's /health (train/trainer/corpus_check.py)

    @classmethod
    def parse(cls, argv=None) -> "EvalOptions":
        """The options of a command line (argparse errors exit 2, naming the flag)."""
        from train.inference.settings import from_parsed

        ap = build_parser()
        args = ap.parse_args(argv)
        check_args(ap, args)
        return cls(ask=from_parsed(ap, args), data=args.data, checkpoints=args.checkpoints, engines=args.engines,
                   sources=tuple(args.sources.split(",")) if args.sources else None, limit=args.limit,
                   out=args.out, paper_row=args.paper_row, max_failure_rate=args.max_failure_rate,
                   expect_corpus=args.expect_corpus)


def build_parser() -> argparse.ArgumentParser:
    from train.inference.settings import add_flags
    from train.search_r1 import prompts

    ap = argparse.ArgumentParser(prog="python -m train.evaluate", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder, hub id, a name of "
                    "`python -m train.get_model --list`, or a training checkpoint global_step_N (merged once into "
                    "global_step_N/hf); or --checkpoints")
    ap.add_argument("--checkpoints", default=None, metavar="CKPT_DIR",
                    help="evaluate every complete global_step_N in CKPT_DIR (a run's trainer.default_local_dir)")
    ap.add_argument("--data", required=True, help="test parquet (train.data_prep)")
    ap.add_argument("--method", choices=list(prompts.METHODS), default="search_r1",
                    help="search_r1 (the agent; default) or a baseline: direct, cot, rag "
                         "(top-k passages in the prompt)")
    ap.add_argument("--engines", type=int, default=None,
                    help="inference engines, one process each (default: one per visible GPU, or per "
                         "--tensor-parallel-size GPUs; 1 without GPUs)")
    ap.add_argument("--sources", default=None, help="comma-separated data_source names")
    ap.add_argument("--limit", type=int, default=None, help="at most N rows per source")
    ap.add_argument("--out", default=None, help="per-sample jsonl (default runs/eval/<model>.jsonl); with "
                                                "--checkpoints a folder (default CKPT_DIR/eval)")
    ap.add_argument("--paper-row", default=None, help="print the paper's numbers for this row beside ours")
    ap.add_argument("--expect-corpus", default=None, metavar="CORPUS",
                    help="the corpus the retriever must serve, checked against its /health before any question: "
                         "wiki18, sample, a passage count, an index_id, or any (no check). Default: wiki18 with "
                         "--paper-row, else any")
    ap.add_argument("--max-failure-rate", type=float, default=0.5,
                    help="stop when more than this share of the last 50 searches failed (default 0.5); rows "
                         "that saw a failed search are never written")
    add_flags(ap, sampling=False, concurrency_help="questions in flight per engine (default %(default)s)")
    return ap



def check_args(ap, args) -> None:
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be >= 1")
    if not 0.0 <= args.max_failure_rate <= 1.0:
        ap.error("--max-failure-rate must be in [0, 1]")
    if args.engines is not None and args.engines < 1:
        ap.error("--engines must be >= 1")
    if bool(args.model) == bool(args.checkpoints):
        ap.error("give --model or --checkpoints (one of them)")

