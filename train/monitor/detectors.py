"""Detectors over per-step records: the collapse warning, today's alarm and single-signal baselines.

Each detector is fed one step's record at a time (:meth:`Detector.update`, the same call live in the
trainer and in a replay) and answers a :class:`Decision`: level ``OK``, ``WATCH`` or ``ALARM`` and the
signals behind it. Pure Python.

The warning's signals (docs/training.md#collapse-warning explains each):

============== ==========================================================================================
``probe``      likelihood displaced on the same tokens: ``probe/drop`` (the fixed probe's first scoring
               minus now, nats per token; the answer span's if larger)
``ratio``      ``actor/llds/ratio_low_share``: non-negative-advantage tokens whose ratio fell below 0.5
``displaced``  ``actor/llds/d_mean_preserved``: their mean log-likelihood fall within the step
``format``     ``search_r1/valid_format`` fallen below its step-1 value (rollouts before any update)
``searches``   ``search_r1/searches`` fallen below its step-1 value (relative)
``cut``        ``search_r1/stopped_length`` risen above its step-1 value
``repeat``     ``search_r1/repetition`` risen above its step-1 value
``entropy``    ``search_r1/sample_nll`` moved away from its step-1 value (|log ratio|: falls and rises)
``update``     ``actor/grad_norm / search_r1/adv_token_share`` over its median on earlier steps that
               carried a learning signal (a step whose every advantage is 0 moves no baseline and fires
               nothing)
============== ==========================================================================================

A signal is at WATCH from its ``watch`` threshold and at ALARM from its ``alarm`` threshold
(:class:`Thresholds`, fitted on labelled runs by :func:`train.monitor.scoring.fit`); the warning is at
ALARM when one signal is, or when ``watch_votes`` signals are at WATCH on the same step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable, Mapping, Optional


class Level(IntEnum):
    OK = 0
    WATCH = 1
    ALARM = 2


@dataclass(frozen=True)
class Decision:
    step: int
    level: Level
    signals: tuple[str, ...] = ()     # the signals at the decision's level (or at WATCH, for an OK)
    values: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v:.3g}" for k, v in self.values) or "no signal"
        return f"{self.level.name} at step {self.step}: {shown}"


def _f(record: Mapping, key: str) -> float:
    try:
        v = float(record.get(key, math.nan))
    except (TypeError, ValueError):
        return math.nan
    return v


def _finite(*xs: float) -> bool:
    return all(math.isfinite(x) for x in xs)


class SignalState:
    """What the signals need of the past: the step-1 reference and the update-size history."""

    REFERENCE_KEYS = ("search_r1/valid_format", "search_r1/searches", "search_r1/stopped_length",
                      "search_r1/repetition", "search_r1/sample_nll")

    def __init__(self):
        self.reference: dict[str, float] = {}
        self.update_sizes: list[float] = []

    def scores(self, record: Mapping) -> dict[str, float]:
        """Each signal's score on this step (NaN when it cannot be computed); higher is worse."""
        for key in self.REFERENCE_KEYS:  # the first finite value: the rollouts before any update
            if key not in self.reference and math.isfinite(_f(record, key)):
                self.reference[key] = _f(record, key)
        ref = self.reference
        out: dict[str, float] = {}
        drops = [d for d in (_f(record, "probe/drop"), _f(record, "probe/drop_answer")) if math.isfinite(d)]
        out["probe"] = max(drops) if drops else math.nan
        out["ratio"] = _f(record, "actor/llds/ratio_low_share")
        out["displaced"] = _f(record, "actor/llds/d_mean_preserved")
        out["format"] = ref.get("search_r1/valid_format", math.nan) - _f(record, "search_r1/valid_format")
        r = ref.get("search_r1/searches", math.nan)
        out["searches"] = (r - _f(record, "search_r1/searches")) / max(r, 0.1) if math.isfinite(r) else math.nan
        out["cut"] = _f(record, "search_r1/stopped_length") - ref.get("search_r1/stopped_length", math.nan)
        out["repeat"] = _f(record, "search_r1/repetition") - ref.get("search_r1/repetition", math.nan)
        nll, r = _f(record, "search_r1/sample_nll"), ref.get("search_r1/sample_nll", math.nan)
        out["entropy"] = abs(math.log(nll / r)) if _finite(nll, r) and nll > 0 and r > 0 else math.nan
        share, grad = _f(record, "search_r1/adv_token_share"), _f(record, "actor/grad_norm")
        out["update"] = math.nan
        if _finite(share, grad) and share > 0:
            size = grad / share
            if len(self.update_sizes) >= 2:
                median = statistics.median(self.update_sizes)
                out["update"] = size / median if median > 0 else math.nan
            self.update_sizes.append(size)
        elif not math.isfinite(grad):
            out["update"] = math.inf
        return out


SIGNALS = ("probe", "ratio", "displaced", "format", "searches", "cut", "repeat", "entropy", "update")
#: the signals the shipped warning alarms on (``collapse_warning.levels``): chosen on the seed-fold replay of
#: the development variants, where every signal with two WATCH votes raised 1.6 false alarms per 100 healthy
#: steps and ``ratio`` alone none at the same recall; ``probe`` is kept beside it because it is the only
#: signal that sees the injected fault (docs/training.md#the-collapse-corpus-and-how-well-the-warning-does).
#: Every signal is still scored and logged each step; give one a level to make it fire.
ALARMING = ("ratio", "probe")


@dataclass
class Thresholds:
    """Per signal: ``(watch, alarm)``; a signal absent here never fires."""
    levels: dict[str, tuple[float, float]] = field(default_factory=dict)
    watch_votes: int = 2

    def as_dict(self) -> dict:
        return {"levels": {k: list(v) for k, v in self.levels.items()}, "watch_votes": self.watch_votes}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Thresholds":
        levels = {}
        for k, v in dict(d.get("levels") or {}).items():
            if k not in SIGNALS:
                raise ValueError(f"collapse_warning: unknown signal {k!r} (known: {', '.join(SIGNALS)})")
            watch, alarm = (float(x) for x in v)
            if not watch <= alarm:
                raise ValueError(f"collapse_warning: signal {k}: watch {watch} must be <= alarm {alarm}")
            levels[k] = (watch, alarm)
        votes = int(d.get("watch_votes", 2))
        if votes < 1:
            raise ValueError(f"collapse_warning.watch_votes must be >= 1, got {votes}")
        return cls(levels, votes)


class Detector:
    name = "detector"

    def update(self, step: int, record: Mapping) -> Decision:
        raise NotImplementedError

    def replay(self, steps: list[dict]) -> list[Decision]:
        return [self.update(int(s["step"]), s) for s in steps]


class CollapseWarning(Detector):
    """The warning: any signal at ALARM, or ``watch_votes`` signals at WATCH on one step."""
    name = "warning"

    def __init__(self, thresholds: Thresholds, signals: Optional[tuple[str, ...]] = None, name: str = ""):
        self.thresholds = thresholds
        self.signals = tuple(signals or thresholds.levels)
        self.state = SignalState()
        if name:
            self.name = name

    def update(self, step: int, record: Mapping) -> Decision:
        scores = self.state.scores(record)
        self.last_scores = scores
        alarm, watch = [], []
        for sig in self.signals:
            if sig not in self.thresholds.levels:
                continue
            w, a = self.thresholds.levels[sig]
            v = scores.get(sig, math.nan)
            if math.isnan(v):
                continue
            if v >= a:
                alarm.append(sig)
            elif v >= w:
                watch.append(sig)
        self.last_levels = {sig: 2 if sig in alarm else 1 if sig in watch else 0 for sig in self.signals}
        values = tuple((s, scores[s]) for s in alarm + watch)
        if alarm or len(watch) >= self.thresholds.watch_votes:
            return Decision(step, Level.ALARM, tuple(alarm + watch), values)
        if watch:
            return Decision(step, Level.WATCH, tuple(watch), values)
        return Decision(step, Level.OK)


class RuleDetector(Detector):
    """A baseline from one rule over the record and the past records: ``rule(past, record) -> fired``."""

    def __init__(self, name: str, rule: Callable[[list[Mapping], Mapping], bool]):
        self.name = name
        self.rule = rule
        self.past: list[Mapping] = []

    def update(self, step: int, record: Mapping) -> Decision:
        fired = self.rule(self.past, record)
        self.past.append(record)
        return Decision(step, Level.ALARM if fired else Level.OK, (self.name,) if fired else ())


class TodaysAlarm(Detector):
    """``lld_alarm`` as the trainer ran it until this warning (:mod:`train.monitor.lld_alarm`), replayed."""
    name = "lld_alarm"

    def __init__(self):
        from train.monitor.lld_alarm import CollapseMonitor

        self.monitor = CollapseMonitor()

    def update(self, step: int, record: Mapping) -> Decision:
        _, messages = self.monitor.update(step, {k: v for k, v in record.items() if k != "step"})
        return Decision(step, Level.ALARM if messages else Level.OK, ("lld_alarm",) if messages else ())


def reward_drop(fraction: float = 0.75):
    """Baseline: the reward's moving average below ``fraction`` of its running peak (lead <= 0 by design)."""
    def rule(past, record):
        rewards = [_f(r, "critic/score/mean") for r in [*past, record]]
        ema, peak = None, -math.inf
        for v in rewards:
            if math.isfinite(v):
                ema = v if ema is None else 0.5 * v + 0.5 * ema
                peak = max(peak, ema)
        return ema is not None and peak >= 0.1 and ema < fraction * peak
    return rule


def grad_norm_spike(factor: float):
    """Baseline: ``grad_norm`` above ``factor`` x its median over earlier steps with a learning signal."""
    def rule(past, record):
        g = _f(record, "actor/grad_norm")
        if not math.isfinite(g):
            return True
        prev = [_f(r, "actor/grad_norm") for r in past if _f(r, "search_r1/adv_token_share") > 0]
        prev = [p for p in prev if math.isfinite(p)]
        return len(prev) >= 2 and _f(record, "search_r1/adv_token_share") > 0 and g > factor * statistics.median(prev)
    return rule


ACTIONS = ("warn", "stop", "rollback")


@dataclass(frozen=True)
class WarningConfig:
    """The ``collapse_warning:`` block (configs/_base.yaml; docs/training.md#collapse-warning)."""
    enable: bool = True
    action: str = "warn"           # warn: log the signals; stop: save the step, exit naming them; rollback:
    #                                resume from before the warning began (train/trainer/rollback.py)
    probe_rows: int = 8            # the displacement probe's trajectories (0: no probe)
    thresholds: Thresholds = field(default_factory=Thresholds)
    rollback_lr_scale: float = 0.5  # rollback: the actor's learning rate is multiplied by this at each rollback
    max_rollbacks: int = 2         # rollback: an alarm after this many rollbacks stops the run (as action=stop)

    @classmethod
    def from_dict(cls, d: Optional[Mapping]) -> "WarningConfig":
        d = dict(d or {})
        known = {"enable", "action", "probe_rows", "watch_votes", "levels", "rollback_lr_scale", "max_rollbacks"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"collapse_warning: unknown keys {unknown} (known: {sorted(known)})")
        action = d.get("action", "warn")
        if action not in ACTIONS:
            raise ValueError(f"collapse_warning.action must be one of {', '.join(ACTIONS)}, got {action!r}")
        rows = d.get("probe_rows", 8)
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise ValueError(f"collapse_warning.probe_rows must be an integer >= 0, got {rows!r}")
        if not isinstance(d.get("enable", True), bool):
            raise ValueError(f"collapse_warning.enable must be true or false, got {d['enable']!r}")
        scale = d.get("rollback_lr_scale", 0.5)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 1:
            raise ValueError(f"collapse_warning.rollback_lr_scale must be a number in (0, 1], got {scale!r}")
        most = d.get("max_rollbacks", 2)
        if not isinstance(most, int) or isinstance(most, bool) or most < 0:
            raise ValueError(f"collapse_warning.max_rollbacks must be an integer >= 0, got {most!r}")
        th = Thresholds.from_dict({"levels": d.get("levels") or {}, "watch_votes": d.get("watch_votes", 2)})
        return cls(bool(d.get("enable", True)), action, rows, th, float(scale), most)


#: the per-step keys the live warning logs: its level (0 OK, 1 WATCH, 2 ALARM), every signal's score and
#: every signal's own level
LEVEL_KEY = "search_r1/warning"
SIGNAL_PREFIX = "search_r1/signal/"
SIGNAL_LEVEL_PREFIX = "search_r1/signal_level/"


def step_record(metrics: Mapping) -> dict[str, float]:
    """One step's metrics as the trainer holds them (lists per mini-batch) -> the record a detector reads
    (their mean: what verl logs)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (list, tuple)):
            vals = [float(x) for x in v if isinstance(x, (int, float))]
            if vals:
                out[k] = sum(vals) / len(vals)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
    return out
