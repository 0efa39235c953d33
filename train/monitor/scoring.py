"""How often a detector is right, over labelled runs, and fitting the warning's thresholds.

Per detector (only ALARM decisions count as alarms; WATCH is shown, never scored):

- **recall**: collapses with an alarm in the ``WINDOW`` steps before onset or on the onset step;
- **lead**: onset step minus the first such alarm (median over the hits);
- **false alarms per 100 healthy steps**: alarm steps in runs that did not collapse (healthy and
  transient), plus alarms earlier than the window in runs that did, per 100 such steps;
- **healthy runs alarmed**: the share of runs that did not collapse with any alarm;
- **precision**: of the runs with an alarm, the share that collapsed (run level).

Censored runs are left out; injected faults are scored in a row of their own, never with natural runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable

from train.monitor.detectors import ALARMING, CollapseWarning, Detector, Level, Thresholds
from train.monitor.labels import Label
from train.monitor.records import Run

WINDOW = 20
#: an onset at or before this step leaves no room for a lead ("instant" collapses, scored apart for the lead)
INSTANT = 2


@dataclass
class Score:
    collapses: int = 0
    hits: int = 0
    leads: list[int] = field(default_factory=list)
    leads_not_instant: list[int] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    healthy_steps: int = 0
    false_alarm_steps: int = 0
    healthy_runs: int = 0
    healthy_runs_alarmed: int = 0
    alarmed_runs: int = 0
    alarmed_collapses: int = 0

    @property
    def recall(self) -> float:
        return self.hits / self.collapses if self.collapses else math.nan

    @property
    def false_alarms_per_100(self) -> float:
        return 100 * self.false_alarm_steps / self.healthy_steps if self.healthy_steps else math.nan

    @property
    def healthy_alarmed_share(self) -> float:
        return self.healthy_runs_alarmed / self.healthy_runs if self.healthy_runs else math.nan

    @property
    def precision(self) -> float:
        return self.alarmed_collapses / self.alarmed_runs if self.alarmed_runs else math.nan

    @property
    def median_lead(self) -> float:
        return statistics.median(self.leads) if self.leads else math.nan

    @property
    def median_lead_not_instant(self) -> float:
        return statistics.median(self.leads_not_instant) if self.leads_not_instant else math.nan

    def add(self, other: "Score") -> "Score":
        out = Score()
        for f in self.__dataclass_fields__:
            setattr(out, f, getattr(self, f) + getattr(other, f))
        return out


def score_run(decisions: list, run: Run, lab: Label, into: Score) -> None:
    alarms = [d.step for d in decisions if d.level >= Level.ALARM]
    if lab.kind == "censored":
        return
    if lab.kind == "collapse":
        into.collapses += 1
        onset = lab.onset
        window = [s for s in alarms if onset - WINDOW <= s <= onset]
        early = [s for s in alarms if s < onset - WINDOW]
        into.healthy_steps += len([d for d in decisions if d.step < onset - WINDOW])
        into.false_alarm_steps += len(early)
        if window:
            into.hits += 1
            into.leads.append(onset - window[0])
            if onset > INSTANT:
                into.leads_not_instant.append(onset - window[0])
        else:
            into.missed.append(run.name)
        if [s for s in alarms if s <= onset]:
            into.alarmed_runs += 1
            into.alarmed_collapses += 1
        return
    into.healthy_runs += 1
    into.healthy_steps += len(decisions)
    into.false_alarm_steps += len(alarms)
    if alarms:
        into.healthy_runs_alarmed += 1
        into.alarmed_runs += 1


def score(make: Callable[[], Detector], runs: Iterable[Run], labels: dict[str, Label]) -> Score:
    out = Score()
    for run in runs:
        score_run(make().replay(run.steps), run, run_label(run, labels), out)
    return out


def run_label(run: Run, labels: dict[str, Label]) -> Label:
    return labels[run.name]


def signal_scores(run: Run) -> list[dict[str, float]]:
    """Each step's signal scores (what the thresholds are compared with)."""
    from train.monitor.detectors import SignalState

    state = SignalState()
    return [state.scores(s) for s in run.steps]


def fit(runs: list[Run], labels: dict[str, Label], signals: tuple[str, ...] = ALARMING, margin: float = 1.5,
        watch_quantile: float = 1.0) -> Thresholds:
    """Thresholds from labelled runs (natural ones; faults are positive controls, never fitted on):
    a signal's ALARM level is ``margin`` x its largest value on the steps of runs that did not collapse
    (none of them alarms on what it was fitted on), its WATCH level that value's ``watch_quantile``;
    a signal is kept only if it would have caught at least one fitted collapse in its window."""
    healthy: dict[str, list[float]] = {s: [] for s in signals}
    before: dict[str, list[float]] = {s: [] for s in signals}  # per collapse: the largest value in its window
    for run in runs:
        lab = labels[run.name]
        if run.fault or lab.kind == "censored":
            continue
        rows = signal_scores(run)
        for sig in signals:
            vals = [(s["step"], r[sig]) for s, r in zip(run.steps, rows) if not math.isnan(r[sig])]
            if lab.kind == "collapse":
                window = [v for step, v in vals if lab.onset - WINDOW <= step <= lab.onset]
                if window:
                    before[sig].append(max(window))
            else:
                healthy[sig] += [v for _, v in vals]
    levels = {}
    for sig in signals:
        if not healthy[sig]:
            continue
        values = sorted(healthy[sig])
        top = values[-1]
        alarm = top * margin if top > 0 else top + 1e-6
        watch = values[min(len(values) - 1, int(watch_quantile * len(values)))]
        if math.isinf(alarm) or not any(v >= alarm for v in before[sig]):
            continue
        levels[sig] = (round(min(watch, alarm), 6), round(alarm, 6))
    return Thresholds(levels)


def cross_validated(runs: list[Run], labels: dict[str, Label], folds: Callable[[Run], int], signals=ALARMING,
                    name: str = "warning") -> tuple[Score, list[Thresholds]]:
    """Each fold's runs scored with the thresholds fitted on the other folds (never on themselves)."""
    total, fitted = Score(), []
    for fold in sorted({folds(r) for r in runs}):
        train = [r for r in runs if folds(r) != fold]
        test = [r for r in runs if folds(r) == fold]
        th = fit(train, labels, signals)
        fitted.append(th)
        total = total.add(score(lambda: CollapseWarning(th, name=name), test, labels))
    return total, fitted
