"""Plots of training runs from their metrics files (reward, search behaviour, LLDS, LLD diagnostics), one run or
several on the same axes. The command is ``python -m train.plot``."""

from __future__ import annotations

import re
from pathlib import Path

REWARD = "critic/score/mean"
WARNING = "search_r1/warning"              # 0 OK, 1 WATCH, 2 ALARM (train/monitor/detectors.py)
SIGNAL_LEVEL = "search_r1/signal_level/"   # + signal name: that signal's own level
SIGNAL = "search_r1/signal/"               # + signal name: its score


def warning_steps(steps: dict[int, dict[str, float]]) -> list[tuple[int, int, list[str]]]:
    """``(step, level, signals at WATCH or above)`` for each step the collapse warning was not OK."""
    out = []
    for s in sorted(steps):
        level = int(steps[s].get(WARNING, 0) or 0)
        if level > 0:
            names = [k[len(SIGNAL_LEVEL):] for k, v in steps[s].items() if k.startswith(SIGNAL_LEVEL) and v >= 1]
            out.append((s, level, sorted(names)))
    return out


def mark_warnings(ax, runs, labels) -> None:
    """WATCH (orange, dotted) and ALARM (red, dashed) steps as vertical lines, each named by its signals."""
    shown = set()
    for r, steps in enumerate(runs):
        for s, level, names in warning_steps(steps):
            kind = "ALARM" if level >= 2 else "WATCH"
            label = kind if len(runs) == 1 else f"{labels[r]}: {kind}"
            ax.axvline(s, color="red" if level >= 2 else "orange", alpha=0.6, linestyle="--" if level >= 2 else ":",
                       label=None if label in shown else label)
            shown.add(label)
            ax.annotate(", ".join(names), (s, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                        va="top", ha="right", color="red" if level >= 2 else "darkorange")
    if shown:
        ax.legend(fontsize=8)


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
    mark_warnings(ax, runs, labels)
    save(fig, "lld.png")

    # the collapse warning: each signal's score, with the WATCH and ALARM steps named by their signals
    names = [k[len(SIGNAL):] for k in keys_matching(runs, re.escape(SIGNAL) + r"\w+")]
    if names:
        fig, axes = plt.subplots(2, 1, figsize=(12, 8))
        first = [n for n in names if n in ("probe", "ratio", "displaced", "update")]
        rest = [n for n in names if n not in first]
        for ax, group, title in ((axes[0], first, "likelihood and update signals"),
                                 (axes[1], rest, "rollout behaviour against step 1")):
            _panel(ax, runs, labels, [SIGNAL + n for n in group], group, "score (higher: worse)",
                   f"collapse warning: {title}", gaps=True)
            mark_warnings(ax, runs, labels)
        save(fig, "warning.png")
    return written
