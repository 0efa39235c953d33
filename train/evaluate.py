"""python -m train.evaluate: the 7-benchmark evaluation (EM/F1 per source, beside the paper's row).

Its usage, what it writes and its exit status are ``--help`` (one text: ``DESCRIPTION`` in
:mod:`train.evaluation.options`, with the arguments). The run: :mod:`train.evaluation.runner` (one engine
here, or a pool of engine processes, :mod:`train.evaluation.pool`); the table:
:mod:`train.evaluation.report`; ``--checkpoints``: :mod:`train.evaluation.checkpoint_sweep`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from train.errors import EngineDead, RetrieverDown, UserError, exit_on_error


@exit_on_error
def main(argv=None, generator=None) -> int:
    """``generator`` (a server manager) replaces the model backend; tests pass a scripted one."""
    from train.evaluation.checkpoint_input import model_folder, results_name
    from train.evaluation.options import EvalOptions
    from train.evaluation.report import describe_speed, paper_row, table
    from train.evaluation.results import load_rows
    from train.evaluation.runner import run_model
    from train.trainer.corpus_check import evaluation_check

    opts = EvalOptions.parse(argv)
    paper = paper_row(opts.paper_row)
    evaluation_check(opts.ask, opts.paper_row, opts.expect_corpus)  # a paper row searches wiki-18
    rows = load_rows(opts.data, list(opts.sources) if opts.sources else None, opts.limit)
    if not rows:
        raise UserError("no rows selected")
    try:
        if opts.checkpoints:
            from train.evaluation.checkpoint_sweep import evaluate_checkpoints

            return evaluate_checkpoints(opts, rows, paper, generator)
        model = model_folder(opts.ask.model)  # a training checkpoint: its merged global_step_N/hf
        out = Path(opts.out or Path("runs/eval") / (results_name(opts.ask.model) + ".jsonl"))
        results, stats = run_model(opts, model, rows, out, generator)
    except EngineDead as e:
        raise EngineDead(f"{e}; the rows written so far are kept in the results file: rerun the same command "
                         f"to evaluate the others") from None
    except RetrieverDown as e:
        partial = e.results
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
