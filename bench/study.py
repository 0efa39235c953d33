"""Does LLDS keep a GRPO run alive? GRPO, GRPO+LLDS, GRPO+LLDS-MA and GRPO+SAPO's drift penalty, side by side
over seeds, in two regimes, on the learnable toy task.

    python bench/study.py --run        # run what is missing (resumable), then report
    python bench/study.py              # report from the recorded runs only

- Regimes (:data:`bench.collapse_corpus.REGIMES`): ``preset``, configs/cpu_learn.yaml as shipped (``make
  demo``: 8 questions x 8 samples, 2 optimizer updates per rollout batch); ``updates4`` and ``updates8``, the
  same with 4 and 8 updates per rollout batch (``ppo_mini_batch_size`` 2 and 1), the knob that collapsed
  plain GRPO in the collapse corpus (1 of 4 seeds and 4 of 4). The released LLDS runs take 10 updates per
  batch.
- Arms: :data:`bench.collapse_corpus.ARMS`. Every arm of a seed starts from the same warm start and sees
  the same questions in the same order (``data.seed = rollout.seed = seed``).
- The runs are the collapse corpus's (``bench/collapse_corpus/toy/<arm><regime>-s<seed>.jsonl``, written
  by ``bench/collapse_corpus.py``: a run is recorded whole when it finishes, never redone); a run's
  collapse label and onset come from its rewards (:mod:`train.monitor.labels`).

Per arm and regime it reports the share of runs that collapsed and their onsets, the final training
reward (mean of the last 3 steps), and the paired difference against GRPO on the same seed, each with a
percentile-bootstrap 95% interval over the seeds; it writes ``bench/study/toy.json`` and the curves
``bench/study/toy.png`` (reward, the fixed probe's log-likelihood of successful trajectories, entropy,
searches: the mean over seeds, the band their range).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_smollm2 import bootstrap_mean  # noqa: E402
from bench.collapse_corpus import ARMS, REGIMES, run_file  # noqa: E402

REWARD = "critic/score/mean"
FINAL = 3  # the final reward: the mean of the last FINAL steps
CURVES = [(REWARD, "training reward"), ("probe/logp", "probe log-likelihood\n(successful trajectories)"),
          ("actor/entropy", "entropy"), ("search_r1/searches", "searches per trajectory")]


def collect(corpus: Path, seeds: list[int]) -> dict:
    """{regime: {arm: {seed: Run}}} of the recorded runs (a missing run is absent)."""
    from train.monitor.records import read_run

    found: dict = {}
    for regime, (suffix, _) in REGIMES.items():
        for arm in ARMS:
            for seed in seeds:
                path = run_file(corpus, arm + suffix, seed)
                if path.is_file():
                    found.setdefault(regime, {}).setdefault(arm, {})[seed] = read_run(path)
    return found


def final_reward(run) -> float:
    values = [v for v in run.series(REWARD) if math.isfinite(v)]
    return sum(values[-FINAL:]) / len(values[-FINAL:]) if values else float("nan")


def summarise(found: dict) -> dict:
    """The study's numbers per regime and arm (see the module's docstring)."""
    from train.monitor.labels import label

    out: dict = {}
    for regime, arms in found.items():
        base = arms.get("grpo", {})
        for arm, runs in arms.items():
            seeds = sorted(runs)
            labels = {s: label(runs[s]) for s in seeds}
            finals = [final_reward(runs[s]) for s in seeds]
            paired = sorted(set(seeds) & set(base))
            diffs = [final_reward(runs[s]) - final_reward(base[s]) for s in paired]
            row = {
                "arm": ARMS[arm][0], "seeds": seeds,
                "collapsed": sum(lab.kind == "collapse" for lab in labels.values()),
                "censored": sum(lab.kind == "censored" for lab in labels.values()),
                "onsets": [labels[s].onset for s in seeds if labels[s].kind == "collapse"],
                "labels": {str(s): labels[s].kind for s in seeds},
                "final_reward": sum(finals) / len(finals),
                "final_reward_ci95": bootstrap_mean(finals) if len(finals) > 1 else None,
                "final_reward_per_seed": {str(s): round(f, 4) for s, f in zip(seeds, finals)},
                "peak_reward": sum(max(r.series(REWARD)) for r in runs.values()) / len(runs),
            }
            if arm != "grpo" and len(diffs) > 1:
                row["vs_grpo"] = {"seeds": paired, "diff": sum(diffs) / len(diffs), "ci95": bootstrap_mean(diffs)}
            out.setdefault(regime, {})[arm] = row
    return out


def table(summary: dict) -> str:
    lines = []
    for regime, arms in summary.items():
        lines += [f"**{regime}** regime", "",
                  "| arm | seeds | collapsed (onset steps) | final reward [95% CI over seeds] "
                  "| minus GRPO, paired by seed |",
                  "| --- | --- | --- | --- | --- |"]
        for row in arms.values():
            ci = row["final_reward_ci95"]
            vs = row.get("vs_grpo")
            onsets = ", ".join(map(str, row["onsets"]))
            lines.append(
                f"| {row['arm']} | {len(row['seeds'])} | {row['collapsed']}/{len(row['seeds'])}"
                f"{f' ({onsets})' if onsets else ''}"
                f"{f'; {c} still below at the end' if (c := row.get('censored')) else ''} | {row['final_reward']:.3f}"
                f"{f' [{ci[0]:.3f}, {ci[1]:.3f}]' if ci else ''} | "
                + (f"{vs['diff']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}]" if vs else "-") + " |")
        lines.append("")
    return "\n".join(lines)


def plot(found: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(found)
    fig, axes = plt.subplots(len(regimes), len(CURVES), figsize=(4.2 * len(CURVES), 3.3 * len(regimes)),
                             squeeze=False)
    for i, regime in enumerate(regimes):
        for j, (key, name) in enumerate(CURVES):
            ax = axes[i][j]
            for arm, runs in found[regime].items():
                series = [r.series(key) for r in runs.values()]
                steps = [s["step"] for s in next(iter(runs.values())).steps]
                n = min(len(s) for s in series)
                cols = [[s[t] for s in series if math.isfinite(s[t])] for t in range(n)]
                mean = [sum(c) / len(c) if c else math.nan for c in cols]
                lo = [min(c) if c else math.nan for c in cols]
                hi = [max(c) if c else math.nan for c in cols]
                line, = ax.plot(steps[:n], mean, label=f"{ARMS[arm][0]} ({len(series)})")
                ax.fill_between(steps[:n], lo, hi, color=line.get_color(), alpha=0.15)
            ax.set_title(f"{regime}: {name}", fontsize=9)
            ax.set_xlabel("step")
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run the missing runs first (bench/collapse_corpus.py)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--corpus", default="bench/collapse_corpus")
    ap.add_argument("--out", default="bench/study")
    args = ap.parse_args(argv)
    corpus, out = (ROOT / args.corpus).resolve(), (ROOT / args.out).resolve()
    if args.run:
        from bench import collapse_corpus

        variants = [arm + suffix for suffix, _ in REGIMES.values() for arm in ARMS]
        collapse_corpus.main(["--variants", *variants, "--seeds", *map(str, args.seeds), "--out", str(corpus)])
    found = collect(corpus, args.seeds)
    if not found:
        raise SystemExit(f"no study runs under {corpus / 'toy'}; run: python bench/study.py --run")
    summary = summarise(found)
    out.mkdir(parents=True, exist_ok=True)
    (out / "toy.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(found, out / "toy.png")
    print(table(summary))
    print(f"-> {out / 'toy.json'}, {out / 'toy.png'}")


if __name__ == "__main__":
    main()
