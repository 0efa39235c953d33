"""python -m train.plot: plots of a training run from its local metrics file (verl's file logger; no wandb needed).

    python -m train.plot RUN_DIR                       # RUN_DIR/metrics.jsonl -> RUN_DIR/plots/*.png
    python -m train.plot runs/on runs/off --labels "LLDS on" "LLDS off" --out runs/compare

A run writes the file when its config has ``trainer.logger: [console, file]``, at the path in
``VERL_FILE_LOGGER_PATH`` (``make demo`` sets ``runs/demo/learn/metrics.jsonl``). One line per
logging call, ``{"step": N, "data": {metric: value}}``. Several runs go on the same axes.

PNGs written (each series only where the run logged it):

* ``reward.png``: training reward per step (``critic/score/mean``) and validation EM
  (``val-core/*/reward/mean@1``).
* ``search.png``: searches per trajectory, answered share, response length.
* ``llds.png``: the LLDS penalty and the share of actions / responses the gate opens.
* ``lld.png``: the paper's LLD diagnostic: the log-likelihood of positive-advantage tokens, per
  action position and for the answer span, per step; steps where the collapse alarm fired are marked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from train.errors import exit_on_error
from train.trainer.metrics_file import read_metrics
from train.trainer.plots import plot_runs


@exit_on_error
def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m train.plot", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (holding metrics.jsonl) or metrics files")
    ap.add_argument("--labels", nargs="+", default=None, help="one per run (default: the directory names)")
    ap.add_argument("--out", default=None, help="where the PNGs go (default: RUN_DIR/plots for one run)")
    args = ap.parse_args(argv)
    paths = [Path(r) for r in args.runs]
    labels = args.labels or [p.name if p.is_dir() else p.parent.name for p in paths]
    if len(labels) != len(paths):
        ap.error(f"--labels: {len(labels)} labels for {len(paths)} runs")
    if args.out is None and len(paths) > 1:
        ap.error("--out is needed with more than one run")
    runs = [read_metrics(p) for p in paths]
    out = Path(args.out) if args.out else (paths[0] if paths[0].is_dir() else paths[0].parent) / "plots"
    for path in plot_runs(runs, labels, out):
        print(path)


if __name__ == "__main__":
    sys.exit(main())
