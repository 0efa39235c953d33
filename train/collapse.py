"""python -m train.collapse: the collapse warning measured on labelled runs, with no training.

    python -m train.collapse label  bench/collapse_corpus        # each run's label, from its rewards only
    python -m train.collapse replay bench/collapse_corpus/toy    # every detector's recall, false alarms, lead
    python -m train.collapse fit    bench/collapse_corpus/toy    # the levels fitted on every natural toy run
    python -m train.collapse replay bench/collapse_corpus/toy --test bench/collapse_corpus/smollm2
                                              # fitted on the toy's runs, scored on SmolLM2's (never fitted on)

``replay`` scores, per detector, the runs it was not fitted on: the warning's thresholds are fitted on
the other folds (``--folds seed``: even seeds vs odd; ``model``: each model on the others). Today's
alarm (``lld_alarm``) and the fixed baselines need no fitting. Injected faults get rows of their own.
What each column means: :mod:`train.monitor.scoring`; the signals: :mod:`train.monitor.detectors`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from train.errors import DataError, exit_on_error


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else format(x, spec)


def _folds(kind: str):
    if kind == "seed":
        return lambda run: int(run.header.get("seed", 0)) % 2
    if kind == "model":
        return lambda run: str(run.header.get("model"))
    raise ValueError(f"--folds must be 'seed' or 'model', got {kind!r}")


def _row(name, s, f) -> str:
    return (f"| {name} | {s.hits}/{s.collapses} = {_fmt(s.recall)} | {_fmt(s.median_lead, '.1f')} "
            f"({_fmt(s.median_lead_not_instant, '.1f')}) | {_fmt(s.false_alarms_per_100, '.1f')} | "
            f"{s.healthy_runs_alarmed}/{s.healthy_runs} | {_fmt(s.precision)} | {f.hits}/{f.collapses} |")


HEADER = ["| detector | recall | median lead (not instant) | false alarms / 100 healthy steps | healthy runs "
          "alarmed | precision | faults caught |", "| --- | --- | --- | --- | --- | --- | --- |"]


def _scored_rows(fitted, scored, faults, labels, warnings) -> list[str]:
    """One row per detector: each warning of ``warnings`` ((name, signals)) with levels fitted on
    ``fitted``, then the fixed baselines; scored on the natural runs ``scored`` and the faults ``faults``."""
    from train.monitor import detectors as d
    from train.monitor.scoring import fit, score

    out = []
    for name, signals in warnings:
        th = fit(fitted, labels, signals)
        make = lambda th=th: d.CollapseWarning(th)  # noqa: E731
        out.append(_row(name, score(make, scored, labels), score(make, faults, labels)))
    for name, make in (("lld_alarm (before)", d.TodaysAlarm),
                       ("reward drop", lambda: d.RuleDetector("reward drop", d.reward_drop()))):
        out.append(_row(name, score(make, scored, labels), score(make, faults, labels)))
    return out


def holdout_table(runs, labels, variants: list[str]) -> list[str]:
    """Thresholds fitted on the runs of the other variants, scored on these variants' runs only."""
    from train.monitor import detectors as d

    test = [r for r in runs if r.header.get("variant") in variants and not r.fault]
    train = [r for r in runs if r.header.get("variant") not in variants and not r.fault]
    if not test:
        raise ValueError(f"--holdout: no run of the variants {variants}")
    n_c = sum(labels[r.name].kind == "collapse" for r in test)
    out = [f"held out: {len(test)} runs of {', '.join(variants)} ({n_c} collapse), thresholds fitted on the "
           f"{len(train)} natural runs of the other variants", *HEADER]
    # no fault among the held-out variants' runs
    return out + _scored_rows(train, test, [], labels, (("warning", d.ALARMING), ("every signal, 2 votes", d.SIGNALS),
                                                        ("ratio only", ("ratio",))))


def test_table(runs, test, labels) -> list[str]:
    """The levels fitted on every natural run of ``runs`` (what ``collapse_warning.levels`` ships), scored on
    ``test``: runs of another corpus (another model) that no choice of signal, margin or level saw."""
    from train.monitor import detectors as d

    natural = [r for r in runs if not r.fault]
    scored = [r for r in test if not r.fault]
    faults = [r for r in test if r.fault]
    if not scored:
        raise ValueError("--test: no natural run in that corpus")
    kinds = [labels[r.name].kind for r in scored]
    models = sorted({str(r.header.get("model")) for r in scored})
    out = [f"test: {len(scored)} runs of {', '.join(models)} ({kinds.count('collapse')} collapse, "
           f"{kinds.count('healthy') + kinds.count('transient')} do not, {kinds.count('censored')} censored), "
           f"levels fitted on the {len(natural)} natural runs above (the shipped ones), never on these", *HEADER]
    return out + _scored_rows(natural, scored, faults, labels, (
        ("warning", d.ALARMING), ("every signal, 2 votes", d.SIGNALS), ("probe only", ("probe",)),
        ("ratio only", ("ratio",))))


def table(runs, labels, folds: str = "seed") -> list[str]:
    from train.monitor import detectors as d
    from train.monitor.scoring import cross_validated, fit, score

    natural = [r for r in runs if not r.fault]
    faults = [r for r in runs if r.fault]
    fold = _folds(folds)
    rows: list[tuple[str, object, object]] = []  # (name, natural score, fault score)
    th_all = fit(natural, labels)
    for name, signals in (("warning", d.ALARMING), ("every signal, 2 votes", d.SIGNALS), ("probe only", ("probe",)),
                          ("entropy only", ("entropy",)), ("ratio only", ("ratio",))):
        cv, _ = cross_validated(natural, labels, fold, signals)
        th = fit(natural, labels, signals)
        rows.append((name, cv, score(lambda: d.CollapseWarning(th), faults, labels)))
    for name, make in (("lld_alarm (before)", d.TodaysAlarm),
                       ("reward drop", lambda: d.RuleDetector("reward drop", d.reward_drop())),
                       ("grad_norm 10x", lambda: d.RuleDetector("grad_norm", d.grad_norm_spike(10.0)))):
        rows.append((name, score(make, natural, labels), score(make, faults, labels)))
    n_c = sum(labels[r.name].kind == "collapse" for r in natural)
    n_h = sum(labels[r.name].kind in ("healthy", "transient") for r in natural)
    out = [f"{len(natural)} natural runs ({n_c} collapse, {n_h} do not, "
           f"{len(natural) - n_c - n_h} censored), {len(faults)} injected faults; warning thresholds fitted on "
           f"the other {folds} fold(s)", *HEADER]
    for name, s, f in rows:
        out.append(_row(name, s, f))
    out.append("")
    out.append("thresholds fitted on every natural run (what collapse_warning.levels ships): "
               + json.dumps(th_all.as_dict()))
    return out


@exit_on_error
def main(argv=None) -> int:
    from train.monitor.labels import label
    from train.monitor.records import read_corpus

    ap = argparse.ArgumentParser(prog="python -m train.collapse", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("label", "replay", "fit"))
    ap.add_argument("corpus", type=Path, help="a folder of run files (*.jsonl), or one file")
    ap.add_argument("--folds", default="seed", choices=("seed", "model"))
    ap.add_argument("--holdout", nargs="*", default=[], metavar="VARIANT",
                    help="replay: also score these variants' runs with thresholds fitted on the other variants")
    ap.add_argument("--test", type=Path, default=None, metavar="CORPUS",
                    help="replay: also score another corpus's runs (another model) with the levels fitted on this one")
    args = ap.parse_args(argv)
    runs = read_corpus(args.corpus)
    test = read_corpus(args.test) if args.test else []
    if args.test and args.test.resolve() in [args.corpus.resolve(), *args.corpus.resolve().parents]:
        raise DataError(f"--test {args.test}: it holds the corpus {args.corpus} the levels are fitted on")
    clash = {r.name for r in runs} & {r.name for r in test}
    if clash:
        raise DataError(f"--test {args.test}: runs named as in {args.corpus} ({', '.join(sorted(clash))}); "
                        "the test runs must be runs the levels were not fitted on")
    labels = {r.name: label(r) for r in [*runs, *test]}
    if args.action == "label":
        for r in runs:
            lab = labels[r.name]
            kind, why = f"{lab.kind}{' (fault)' if r.fault else ''}", lab.why
            rollbacks = r.header.get("rollbacks")
            if r.header.get("stopped"):  # a rollback run the warning ended: its outcome was never seen
                rewards = " ".join(f"{x:.2f}" for x in r.series("critic/score/mean"))
                kind, why = "stopped", (f"the warning stopped it at step {r.steps[-1]['step']} after {rollbacks} "
                                        f"rollback(s); rewards {rewards}")
            elif rollbacks:
                why = f"{why}{'; ' if why else ''}after {rollbacks} rollback(s)"
            print(f"{r.name:<32} {kind:<18} onset {lab.onset if lab.onset is not None else '-':<4} {why}")
        return 0
    if args.action == "fit":
        from train.monitor.scoring import fit

        print(json.dumps(fit([r for r in runs if not r.fault], labels).as_dict(), indent=1))
        return 0
    lines = table(runs, labels, args.folds)
    if args.holdout:
        try:
            lines = lines[:-2] + [""] + holdout_table(runs, labels, args.holdout) + lines[-2:]
        except ValueError as e:
            raise DataError(str(e)) from None
    if test:
        try:
            lines = lines[:-2] + [""] + test_table(runs, test, labels) + lines[-2:]
        except ValueError as e:
            raise DataError(str(e)) from None
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
