"""python -m train.evaluate: the 7-benchmark evaluation (EM/F1 per source, beside the paper's row).

    python -m train.evaluate --model CKPT --data data/processed/test.parquet [--backend vllm]
        [--method search_r1|direct|cot|rag] [--engines N] [--tensor-parallel-size K]
        [--sources nq,hotpotqa] [--limit N] [--out runs/eval/CKPT.jsonl] [--paper-row "3B-Ins GRPO+LLDS"]
    python -m train.evaluate --checkpoints CKPT_DIR --data data/processed/val_sample.parquet [--out DIR]

The arguments: :mod:`train.evaluation.options`; the run: :mod:`train.evaluation.runner` (one engine
here, or a pool of engine processes, :mod:`train.evaluation.pool`); the table:
:mod:`train.evaluation.report`; ``--checkpoints``: :mod:`train.evaluation.checkpoint_sweep`.
Exit status: 0 done, 2 bad input, 3 the retriever failed, 4 an engine died (rows so far are kept in
the results file in both: rerun the same command).
"""

from __future__ import annotations

import sys
from pathlib import Path

from train.errors import EngineDead, RetrieverDown, UserError, exit_on_error


@exit_on_error
def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one."""
    from train.evaluation.options import EvalOptions
    from train.evaluation.report import describe_speed, paper_row, table
    from train.evaluation.results import load_rows
    from train.evaluation.runner import run_model

    opts = EvalOptions.parse(argv)
    paper = paper_row(opts.paper_row)
    rows = load_rows(opts.data, list(opts.sources) if opts.sources else None, opts.limit)
    if not rows:
        raise UserError("no rows selected")
    try:
        if opts.checkpoints:
            from train.evaluation.checkpoint_sweep import evaluate_checkpoints

            return evaluate_checkpoints(opts, rows, paper, generator)
        model = opts.ask.model
        out = Path(opts.out or Path("runs/eval") / (Path(model.rstrip("/")).name + ".jsonl"))
        results, stats = run_model(opts, model, rows, out, generator)
    except EngineDead as e:
        raise EngineDead(f"{e}; the rows written so far are kept in the results file: rerun the same command "
                         f"to evaluate the others") from None
    except RetrieverDown as e:
        partial = e.args[1] if len(e.args) > 1 else []
        if partial:
            print(f"partial table ({len(partial)} of {len(rows)} rows; not a result):")
            print(table(partial, paper))
        raise
    print(table(results, paper))
    print(describe_speed(stats))
    print(f"per-sample results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
