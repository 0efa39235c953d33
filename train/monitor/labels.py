"""Ground truth for the collapse warning, from outcomes only: no signal the warning reads.

A run **collapses** at the first step where

- the smoothed training reward (an exponential moving average, weight ``ALPHA`` on the new step, of
  ``critic/score/mean``) falls below ``FRACTION`` of its running maximum, that maximum being at least
  ``MIN_PEAK``, and stays below for ``HOLD`` steps (the onset is the first of them); or
- the loss or the gradient norm is not finite; or
- training crashed on a non-finite value (the header's ``crashed`` with such an error).

A dip below that line that comes back within ``HOLD`` steps is **transient** (scored apart). A dip still
below at the end of the run with fewer than ``HOLD`` steps seen is **censored**: neither a collapse nor
healthy, left out of the scores. Runs with none of these are **healthy**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from train.monitor.records import Run

ALPHA = 0.5
FRACTION = 0.5
MIN_PEAK = 0.05
HOLD = 5
REWARD = "critic/score/mean"


@dataclass(frozen=True)
class Label:
    kind: str                      # "collapse", "healthy", "transient", "censored"
    onset: int | None = None       # the step of onset (collapse) or of the unconfirmed dip (censored)
    why: str = ""
    transients: tuple[int, ...] = field(default=())  # first steps of dips that recovered

    def as_dict(self) -> dict:
        return {"kind": self.kind, "onset": self.onset, "why": self.why, "transients": list(self.transients)}


def smoothed(values: list[float], alpha: float = ALPHA) -> list[float]:
    out, ema = [], None
    for v in values:
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        ema = v if ema is None else alpha * v + (1 - alpha) * ema
        out.append(ema)
    return out


def label(run: Run) -> Label:
    steps = [s["step"] for s in run.steps]
    for s in run.steps:
        for key in ("actor/pg_loss", "actor/grad_norm"):
            v = s.get(key)
            if v is not None and not math.isfinite(float(v)):
                return Label("collapse", s["step"], f"{key} is not finite at step {s['step']}")
    error = str(run.header.get("error") or "").lower()
    if run.header.get("crashed") and any(w in error for w in ("nan", "inf", "finite")):
        at = (steps[-1] + 1) if steps else 1
        return Label("collapse", at, f"training crashed on a non-finite value at step {at}")
    ema = smoothed(run.series(REWARD))
    peak, below, transients = -math.inf, [], []
    for i, v in enumerate(ema):
        if math.isnan(v):
            continue
        peak = max(peak, v)
        low = peak >= MIN_PEAK and v < FRACTION * peak
        if low:
            below.append(i)
            if len(below) >= HOLD:
                first = below[0]
                return Label("collapse", steps[first],
                             f"smoothed reward {ema[first]:.3f} < {FRACTION} x its peak {peak:.3f} from step "
                             f"{steps[first]} for {HOLD} steps", tuple(transients))
        else:
            if below:
                transients.append(steps[below[0]])
            below = []
    if below:
        return Label("censored", steps[below[0]], f"below half its peak from step {steps[below[0]]} to the end "
                     f"({len(below)} < {HOLD} steps)", tuple(transients))
    if transients:
        return Label("transient", None, f"dips that recovered at steps {transients}", tuple(transients))
    return Label("healthy")
