"""The collapse alarm the trainer ran until the collapse warning (:mod:`train.monitor.detectors`) replaced it,
kept as a baseline: ``python -m train.collapse replay`` scores it beside the warning (its false alarms on
healthy runs are why it was replaced: bench/RESULTS.md).

The LLDS paper (arXiv 2512.04220) describes GRPO's collapse as starting with the log-likelihood of
*correct* (positive-advantage) responses falling while updates go on, followed by exploding policy
ratios and gradient norms. :class:`CollapseMonitor` reads each training step's metrics and raises
the alarm (``search_r1/lld_alarm`` = 1 for that step, and a warning naming the signal and the step)
when either

* **falling**: the watched log-likelihood (default ``actor/llds/logp_pos``, the mean log-probability
  of positive-advantage action tokens under the policy being updated) fell at each of the last
  ``falling_steps`` steps by more than ``min_drop`` nats; or
* **spike**: a watched update statistic (default ``actor/grad_norm`` and ``actor/ppo_kl``, the
  old-vs-new policy KL that grows with the policy ratio) exceeds ``spike_factor`` times its median
  over the previous ``spike_window`` steps (checked once that many steps exist).

Its settings are :class:`AlarmConfig`'s defaults, as the presets ran it. Pure Python: no verl import.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional

ALARM_KEY = "search_r1/lld_alarm"
FALLING_KEY = "search_r1/lld_alarm_falling_steps"


@dataclass(frozen=True)
class AlarmConfig:
    enable: bool = True
    signal: str = "actor/llds/logp_pos"
    falling_steps: int = 4
    min_drop: float = 0.01
    spike_keys: tuple[str, ...] = ("actor/grad_norm", "actor/ppo_kl")
    spike_factor: float = 10.0
    spike_window: int = 5

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> "AlarmConfig":
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"lld_alarm: unknown keys {unknown} (known: {sorted(known)})")
        if "spike_keys" in d:
            keys = d["spike_keys"]
            if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
                raise ValueError(f"lld_alarm.spike_keys must be a list of metric names, got {keys!r}")
            d["spike_keys"] = tuple(keys)
        cfg = cls(**d)
        if not isinstance(cfg.falling_steps, int) or cfg.falling_steps < 1:
            raise ValueError(f"lld_alarm.falling_steps must be an integer >= 1, got {cfg.falling_steps!r}")
        if not isinstance(cfg.spike_window, int) or cfg.spike_window < 1:
            raise ValueError(f"lld_alarm.spike_window must be an integer >= 1, got {cfg.spike_window!r}")
        if not cfg.min_drop >= 0:
            raise ValueError(f"lld_alarm.min_drop must be >= 0, got {cfg.min_drop!r}")
        if not cfg.spike_factor > 1:
            raise ValueError(f"lld_alarm.spike_factor must be > 1, got {cfg.spike_factor!r}")
        return cfg


def _value(v: Any) -> Optional[float]:
    """A step's value of one metric: a number, or the mean of a per-mini-batch list; None when
    absent or NaN (a step without positive-advantage tokens has no likelihood to watch)."""
    if isinstance(v, (list, tuple)):
        vals = [float(x) for x in v if not math.isnan(float(x))]
        return sum(vals) / len(vals) if vals else None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


@dataclass
class CollapseMonitor:
    config: AlarmConfig = field(default_factory=AlarmConfig)
    history: dict[str, list[float]] = field(default_factory=dict)
    falling: int = 0
    alarms: list[tuple[int, str]] = field(default_factory=list)

    def update(self, step: int, metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        """Read one step's metrics; return the metrics to log and the warnings (empty when quiet)."""
        cfg = self.config
        if not cfg.enable:
            return {}, []
        messages = []
        value = _value(metrics.get(cfg.signal)) if cfg.signal in metrics else None
        past = self.history.get(cfg.signal, [])
        if value is not None:
            if past and value < past[-1] - cfg.min_drop:
                self.falling += 1
            else:
                self.falling = 0
            if self.falling >= cfg.falling_steps:
                recent = past[-cfg.falling_steps:] + [value]
                trail = " -> ".join(f"{x:.3f}" for x in recent)
                messages.append(f"LLD alarm at step {step}: {cfg.signal} fell {self.falling} steps in a row "
                                f"({trail}) while updates continue: the likelihood of positive-advantage "
                                "tokens is being displaced (the start of the collapse the LLDS paper describes)")
            self.history.setdefault(cfg.signal, []).append(value)
        for key in cfg.spike_keys:
            v = _value(metrics.get(key)) if key in metrics else None
            if v is None:
                continue
            prev = self.history.get(key, [])[-cfg.spike_window:]
            if len(prev) >= cfg.spike_window:
                median = statistics.median(prev)
                if median > 0 and v > cfg.spike_factor * median:
                    messages.append(f"LLD alarm at step {step}: {key} = {v:.4g} spiked to {v / median:.1f}x its "
                                    f"median over the previous {cfg.spike_window} steps ({median:.4g})")
            self.history.setdefault(key, []).append(v)
        self.alarms += [(step, m) for m in messages]
        return {ALARM_KEY: 1.0 if messages else 0.0, FALLING_KEY: float(self.falling)}, messages
