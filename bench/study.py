"""Does LLDS keep a GRPO run alive? GRPO, GRPO+LLDS, GRPO+LLDS-MA and GRPO+SAPO's drift penalty, side by side
over seeds, in two regimes, on the learnable toy task and on SmolLM2-135M-Instruct.

    python bench/study.py --run                  # the toy: run what is missing (resumable), then report
    python bench/study.py                        # the toy: report from the recorded runs only
    python bench/study.py --model smollm2        # SmolLM2 (runs: bench/smollm2_corpus.py; --run calls it)

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
reward (mean of the last 3 steps), the share of trajectories in the protocol's format over those steps
(``search_r1/valid_format``: where a collapse shows before the reward label can call it), and the paired
difference against GRPO on the same seed, each with a
percentile-bootstrap 95% interval over the seeds; it writes ``bench/study/<model>.json`` and the curves
``bench/study/<model>.png`` (reward, the fixed probe's log-likelihood of successful trajectories, entropy,
searches, the format's share: the mean over seeds, the band their range).

On SmolLM2 (regimes :data:`bench.smollm2_corpus.REGIMES`) each run also answered the 200 held-out test
questions (``bench/study/smollm2/heldout/``): per arm, held-out greedy EM (mean over seeds), the share of
questions it gave an answer to, its gain over
the warm start and its difference against GRPO, paired by seed and question, with an interval from a
bootstrap that resamples the seeds and then, within each, the questions (:func:`bootstrap_two_level`): it
covers the spread between runs as well as the choice of questions. The fixes are also paired with each other
(:func:`between_fixes`): two fixes each above GRPO are told apart only by their own difference's interval.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import smollm2_corpus  # noqa: E402
from bench.bench_smollm2 import bootstrap_mean  # noqa: E402
from bench.collapse_corpus import ARMS, REGIMES  # noqa: E402

#: model -> its regimes (name -> (variant suffix, overrides))
MODELS = {"toy": REGIMES, "smollm2": smollm2_corpus.REGIMES}

REWARD = "critic/score/mean"
FORMAT = "search_r1/valid_format"
FINAL = 3  # the final reward: the mean of the last FINAL steps
CURVES = [(REWARD, "training reward"), ("probe/logp", "probe log-likelihood\n(successful trajectories)"),
          ("actor/entropy", "entropy"), ("search_r1/searches", "searches per trajectory"),
          (FORMAT, "valid format\n(share of trajectories)")]


def collect(corpus: Path, seeds: list[int], model: str = "toy") -> dict:
    """{regime: {arm: {seed: Run}}} of the recorded runs (a missing run is absent)."""
    from train.monitor.records import read_run

    found: dict = {}
    for regime, (suffix, _) in MODELS[model].items():
        for arm in ARMS:
            for seed in seeds:
                path = corpus / model / f"{arm + suffix}-s{seed}.jsonl"
                if path.is_file():
                    found.setdefault(regime, {}).setdefault(arm, {})[seed] = read_run(path)
    warm = {r.header.get("warm_start") for arms in found.values() for runs in arms.values() for r in runs.values()}
    if len(warm) > 1:
        raise SystemExit(f"{corpus / model}: runs from {len(warm)} different warm starts ({sorted(map(str, warm))}); "
                         "the arms of a seed must start from the same weights: rerun one warm start's runs")
    return found


def rebuilt_note(found: dict) -> str | None:
    """The runs that started from a rebuilt copy of the study's warm start (bench/smollm2_corpus.py checked
    its held-out answers), with that check: a reader sees which pairs are not bit-identical at step 0."""
    rebuilt = sorted((r.name, r.header["warm_start_weights"], r.header.get("warm_start_check") or {})
                     for arms in found.values() for runs in arms.values() for r in runs.values()
                     if r.header.get("warm_start_weights") not in (None, r.header.get("warm_start")))
    if not rebuilt:
        return None
    parts = [f"{name} (weights {w}: answers agree on {c.get('answers_equal', 0):.1%}, "
             f"EM {c.get('em', float('nan')):.3f} vs {c.get('recorded_em', float('nan')):.3f})"
             for name, w, c in rebuilt]
    return (f"{len(rebuilt)} run(s) started from a rebuilt warm start that counts as the study's by its held-out "
            "answers, not bit for bit: " + "; ".join(parts))


def bootstrap_two_level(per_seed: list[list[float]], n: int = 2000, seed: int = 0) -> list[float]:
    """Percentile-bootstrap 95% interval of the mean of per-question values over seeds: each replicate
    draws the seeds with replacement and then, within each drawn seed, its questions with replacement."""
    import random

    rng = random.Random(seed)
    k = len(per_seed)
    means = []
    for _ in range(n):
        total = count = 0
        for _ in range(k):
            xs = per_seed[rng.randrange(k)]
            total += sum(xs[rng.randrange(len(xs))] for _ in range(len(xs)))
            count += len(xs)
        means.append(total / count)
    means.sort()
    return [round(means[int(0.025 * n)], 4), round(means[int(0.975 * n) - 1], 4)]


def heldout_rows(study: Path, found: dict) -> dict:
    """``{regime: {arm: {seed: {uid: row}}}}``: the held-out rows of every recorded run (an arm with none is
    left out)."""
    from bench.bench_smollm2 import read_rows

    out: dict = {}
    for regime, arms in found.items():
        suffix = MODELS["smollm2"][regime][0]
        for arm, runs in arms.items():
            files = {s: smollm2_corpus.heldout_file(study, f"{arm}{suffix}-s{s}") for s in runs}
            by_seed = {s: read_rows(f) for s, f in files.items() if f.is_file()}
            if by_seed:
                out.setdefault(regime, {})[arm] = by_seed
    return out


def heldout(study: Path, held_rows: dict) -> dict:
    """Per regime and arm of ``held_rows`` (:func:`heldout_rows`): held-out EM over seeds, its gain over the warm
    start and its difference against GRPO, paired by seed and question, each with :func:`bootstrap_two_level`'s
    interval."""
    from bench.bench_smollm2 import read_rows

    warm_path = smollm2_corpus.heldout_file(study, "warm_start")
    warm = read_rows(warm_path) if warm_path.is_file() else None
    out: dict = {}
    for regime, rows in held_rows.items():
        for arm, by_seed in rows.items():
            seeds = sorted(by_seed)
            ems = [[by_seed[s][u]["em"] for u in sorted(by_seed[s])] for s in seeds]
            answered = [sum(bool(str(r.get("answer") or "").strip()) for r in by_seed[s].values()) / len(by_seed[s])
                        for s in seeds]
            row = {"seeds": seeds, "questions": len(ems[0]), "em": sum(map(sum, ems)) / sum(map(len, ems)),
                   "answered": sum(answered) / len(answered),
                   "em_per_seed": {str(s): round(sum(e) / len(e), 4) for s, e in zip(seeds, ems)},
                   "em_ci95": bootstrap_two_level(ems)}
            if warm:
                gains = [[by_seed[s][u]["em"] - warm[u]["em"] for u in sorted(by_seed[s]) if u in warm] for s in seeds]
                row["gain"] = {"em": sum(map(sum, gains)) / sum(map(len, gains)), "ci95": bootstrap_two_level(gains),
                               "warm_start_em": sum(r["em"] for r in warm.values()) / len(warm)}
            vs = paired_em(by_seed, rows["grpo"]) if arm != "grpo" and "grpo" in rows else None
            if vs:
                row["vs_grpo"] = vs
            out.setdefault(regime, {})[arm] = row
    return out


def between_fixes(held_rows: dict) -> dict:
    """Per regime: each fix's held-out EM minus each later fix's (in :data:`ARMS`' order), paired by seed and
    question, for pairs that share a seed: whether the fixes are told apart, not only each against GRPO."""
    out: dict = {}
    for regime, rows in held_rows.items():
        fixes = [arm for arm in rows if arm != "grpo"]
        for i, a in enumerate(fixes):
            for b in fixes[i + 1:]:
                d = paired_em(rows[a], rows[b])
                if d:
                    out.setdefault(regime, {})[f"{a} - {b}"] = d
    return out


def paired_em(a: dict, b: dict) -> dict | None:
    """Held-out EM of ``a`` minus ``b`` (each ``{seed: {uid: row}}``), paired by seed and question, with
    :func:`bootstrap_two_level`'s interval; None when they share no seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diffs = [[a[s][u]["em"] - b[s][u]["em"] for u in sorted(a[s]) if u in b[s]] for s in seeds]
    return {"seeds": seeds, "diff": sum(map(sum, diffs)) / sum(map(len, diffs)), "ci95": bootstrap_two_level(diffs)}


def final_mean(run, key: str = REWARD) -> float:
    """The mean of a run's last FINAL finite values of ``key`` (NaN when it has none)."""
    values = [v for v in run.series(key) if math.isfinite(v)]
    return sum(values[-FINAL:]) / len(values[-FINAL:]) if values else float("nan")


def _mean(xs: list[float]) -> float | None:
    """The mean of the finite values; None (JSON's null) when there is none."""
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def summarise(found: dict) -> dict:
    """The study's numbers per regime and arm (see the module's docstring)."""
    from train.monitor.labels import label

    out: dict = {}
    for regime, arms in found.items():
        base = arms.get("grpo", {})
        for arm, runs in arms.items():
            seeds = sorted(runs)
            labels = {s: label(runs[s]) for s in seeds}
            finals = [final_mean(runs[s]) for s in seeds]
            paired = sorted(set(seeds) & set(base))
            diffs = [final_mean(runs[s]) - final_mean(base[s]) for s in paired]
            row = {
                "arm": ARMS[arm][0], "seeds": seeds,
                "collapsed": sum(lab.kind == "collapse" for lab in labels.values()),
                "censored": sum(lab.kind == "censored" for lab in labels.values()),
                "onsets": [labels[s].onset for s in seeds if labels[s].kind == "collapse"],
                "labels": {str(s): labels[s].kind for s in seeds},
                "final_reward": sum(finals) / len(finals),
                "final_reward_ci95": bootstrap_mean(finals) if len(finals) > 1 else None,
                "final_reward_per_seed": {str(s): round(f, 4) for s, f in zip(seeds, finals)},
                "final_format": _mean([final_mean(runs[s], FORMAT) for s in seeds]),
                "peak_reward": sum(max(r.series(REWARD)) for r in runs.values()) / len(runs),
            }
            if arm != "grpo" and len(diffs) > 1:
                row["vs_grpo"] = {"seeds": paired, "diff": sum(diffs) / len(diffs), "ci95": bootstrap_mean(diffs)}
            out.setdefault(regime, {})[arm] = row
    return out


def heldout_table(held: dict, between: dict | None = None) -> str:
    lines = []
    for regime, arms in held.items():
        lines += [f"**{regime}** regime: held-out EM, 200 test questions, greedy", "",
                  "| arm | seeds | EM [95% CI: seeds, then questions] | answered | gain over the warm start "
                  "| minus GRPO, paired by seed and question |", "| --- | --- | --- | --- | --- | --- |"]
        for arm, row in arms.items():
            ci, g, vs = row["em_ci95"], row.get("gain"), row.get("vs_grpo")
            lines.append(f"| {ARMS[arm][0]} | {len(row['seeds'])} | {row['em']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                         f"{row['answered']:.2f} | "
                         + (f"{g['em']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]" if g else "-") + " | "
                         + (f"{vs['diff']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}]" if vs else "-") + " |")
        lines.append("")
        if (between or {}).get(regime):
            lines += [f"**{regime}** regime: the fixes against each other, held-out EM paired by seed and question", "",
                      "| difference | seeds | EM [95% CI: seeds, then questions] |", "| --- | --- | --- |"]
            for pair, d in between[regime].items():
                a, b = pair.split(" - ")
                lines.append(f"| {ARMS[a][0]} minus {ARMS[b][0]} | {len(d['seeds'])} | "
                             f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |")
            lines.append("")
    return "\n".join(lines)


def table(summary: dict) -> str:
    lines = []
    for regime, arms in summary.items():
        lines += [f"**{regime}** regime", "",
                  "| arm | seeds | collapsed (onset steps) | final reward [95% CI over seeds] "
                  "| valid format, last 3 steps | minus GRPO, paired by seed |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for row in arms.values():
            ci = row["final_reward_ci95"]
            vs = row.get("vs_grpo")
            onsets = ", ".join(map(str, row["onsets"]))
            lines.append(
                f"| {row['arm']} | {len(row['seeds'])} | {row['collapsed']}/{len(row['seeds'])}"
                f"{f' ({onsets})' if onsets else ''}"
                f"{f'; {c} still below at the end' if (c := row.get('censored')) else ''} | {row['final_reward']:.3f}"
                f"{f' [{ci[0]:.3f}, {ci[1]:.3f}]' if ci else ''} | "
                f"{'-' if row.get('final_format') is None else format(row['final_format'], '.2f')} | "
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
    ap.add_argument("--model", choices=list(MODELS), default="toy")
    ap.add_argument("--run", action="store_true", help="run the missing runs first (bench/collapse_corpus.py; "
                    "with --model smollm2, bench/smollm2_corpus.py)")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 0-4 (toy), 0-2 (smollm2)")
    ap.add_argument("--corpus", default="bench/collapse_corpus")
    ap.add_argument("--out", default="bench/study")
    args = ap.parse_args(argv)
    seeds = args.seeds or ([0, 1, 2, 3, 4] if args.model == "toy" else [0, 1, 2])
    corpus, out = (ROOT / args.corpus).resolve(), (ROOT / args.out).resolve()
    if args.run and args.model == "toy":
        from bench import collapse_corpus

        variants = [arm + suffix for suffix, _ in REGIMES.values() for arm in ARMS]
        collapse_corpus.main(["--variants", *variants, "--seeds", *map(str, seeds), "--out", str(corpus)])
    elif args.run:
        smollm2_corpus.main(["--seeds", *map(str, seeds), "--corpus", str(corpus), "--study", str(out)])
    found = collect(corpus, seeds, args.model)
    if not found:
        raise SystemExit(f"no study runs under {corpus / args.model}; run: python bench/study.py --run"
                         + ("" if args.model == "toy" else f" --model {args.model}"))
    summary = summarise(found)
    if args.model == "smollm2":
        held_rows = heldout_rows(out, found)
        summary = {"training": summary, "heldout": heldout(out, held_rows), "between_fixes": between_fixes(held_rows)}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.model}.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(found, out / f"{args.model}.png")
    print(table(summary.get("training", summary)))
    if "heldout" in summary:
        print(heldout_table(summary["heldout"], summary["between_fixes"]))
    note = rebuilt_note(found)
    if note:
        print(note + "\n")
    print(f"-> {out / (args.model + '.json')}, {out / (args.model + '.png')}")


if __name__ == "__main__":
    main()
