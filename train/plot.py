"""Plots of a training run from its local metrics file (verl's file logger; no wandb needed).

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
import json
import re
from pathlib import Path
from typing import Optional

REWARD = "critic/score/mean"
ALARM = "search_r1/lld_alarm"


def read_metrics(path: Path) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` from a verl file-logger jsonl (lines of one step are merged)."""
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (run with trainer.logger=[console,file] and "
                                "VERL_FILE_LOGGER_PATH=RUN_DIR/metrics.jsonl)")
    steps: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step, data = int(rec["step"]), rec["data"]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                raise ValueError(f"{path}:{n}: not a verl file-logger line ({line.strip()[:80]!r})") from None
            row = steps.setdefault(step, {})
            for k, v in data.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[k] = float(v)
    if not steps:
        raise ValueError(f"{path}: the metrics file is empty")
    return steps


def series(steps: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    xs = sorted(s for s in steps if key in steps[s])
    return xs, [steps[s][key] for s in xs]


def keys_matching(runs: list[dict], pattern: str) -> list[str]:
    rx = re.compile(pattern)
    found = {k for steps in runs for row in steps.values() for k in row if rx.fullmatch(k)}
    return sorted(found, key=lambda k: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", k)])


def _panel(ax, runs, labels, keys, names, ylabel, title, styles=("-", "--", ":", "-."), gaps=False):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = False
    for r, (steps, label) in enumerate(zip(runs, labels)):
        for j, (key, name) in enumerate(zip(keys, names)):
            xs, ys = series(steps, key)
            if not xs:
                continue
            if gaps:  # a step without a value breaks the line instead of bridging it
                have = dict(zip(xs, ys))
                train = sorted(s for s in steps if REWARD in steps[s] or s in have)
                xs, ys = train, [have.get(s, float("nan")) for s in train]
            text = name if len(runs) == 1 else (f"{label}: {name}" if len(keys) > 1 else label)
            ax.plot(xs, ys, styles[j % len(styles)] if len(runs) > 1 else "-",
                    color=colors[(r if len(runs) > 1 else j) % len(colors)], marker="o", markersize=3,
                    label=text)
            drawn = True
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes)
    return drawn


def plot_runs(runs: list[dict], labels: list[str], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # reward and EM
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel(axes[0], runs, labels, [REWARD], ["reward (mean over trajectories)"], "reward = exact match",
           "training reward per step")
    val = keys_matching(runs, r"val-core/.+/reward/mean@\d+")
    _panel(axes[1], runs, labels, val, [k.split("/")[1] + " EM" for k in val], "exact match",
           "validation EM (held-out questions)")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
    save(fig, "reward.png")

    # searches and response length
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel(axes[0], runs, labels, ["search_r1/searches", "search_r1/valid_searches", "search_r1/answered"],
           ["searches / trajectory", "parsed searches / trajectory", "share that answers"], "per trajectory",
           "searches and answers")
    axes[0].set_ylim(bottom=0)
    _panel(axes[1], runs, labels, ["response_length/mean"], ["response length (tokens, with observations)"],
           "tokens", "response length")
    save(fig, "search.png")

    # LLDS penalty and gate
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    _panel(axes[0], runs, labels, ["actor/llds/penalty"], ["LLDS term in the loss"], "loss term",
           "LLDS penalty (lambda x mean token penalty)")
    _panel(axes[1], runs, labels, ["actor/llds/gated_action_frac", "actor/llds/gated_response_frac"],
           ["actions gated open", "responses gated open"], "share", "LLDS gate")
    axes[1].set_ylim(-0.02, 1.02)
    save(fig, "llds.png")

    # the LLD diagnostic. The per-position means are logged as 0 where a step has no positive-advantage
    # token at that position (and logp_pos is then absent): those points are not drawn.
    fig, ax = plt.subplots(figsize=(12, 4.8))
    pos = keys_matching(runs, r"actor/llds/logp_pos_a\d+")
    keys = pos + ["actor/llds/logp_pos_answer"]
    lld_runs = [{s: {k: v for k, v in row.items()
                     if not (k in keys and (v == 0.0 or ("actor/llds/logp_pos" not in row and REWARD in row)))}
                 for s, row in steps.items()} for steps in runs]
    keys = [k for k in keys if any(series(s, k)[0] for s in lld_runs)]
    names = [f"action {k.rsplit('_a', 1)[1]}" if re.search(r"_a\d+$", k) else "answer span" for k in keys]
    _panel(ax, lld_runs, labels, keys, names, "mean log-likelihood (nats / token)",
           "LLD diagnostic: log-likelihood of positive-advantage tokens under the updated policy", gaps=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, steps in enumerate(runs):
        color = colors[r % len(colors)] if len(runs) > 1 else "red"
        for s in [s for s in steps if steps[s].get(ALARM, 0) > 0]:
            ax.axvline(s, color=color, alpha=0.5, linestyle=":")
        if any(steps[s].get(ALARM, 0) > 0 for s in steps):
            ax.plot([], [], color=color, alpha=0.5, linestyle=":",
                    label="collapse alarm" if len(runs) == 1 else f"{labels[r]}: collapse alarm")
    if any(steps[s].get(ALARM, 0) > 0 for steps in runs for s in steps):
        ax.legend(fontsize=8)
    save(fig, "lld.png")
    return written


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    try:
        runs = [read_metrics(p) for p in paths]
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    out = Path(args.out) if args.out else (paths[0] if paths[0].is_dir() else paths[0].parent) / "plots"
    for path in plot_runs(runs, labels, out):
        print(path)


if __name__ == "__main__":
    main()
