"""What `make demo` must show to pass, checked on the files it wrote (``python -m train.demo check``).

The demo is a learnability check of the whole pipeline; it passes only when

* **reward rose**: the mean training reward of the last :data:`WINDOW` steps exceeds that of the first
  :data:`WINDOW` by at least :data:`MIN_RISE` (30 steps of GRPO + LLDS from the warm start rose by
  +0.32 to +0.53 in the recorded runs, docs/reproduction-log.md; a flipped advantage gives -0.06);
* **held-out EM rose**: greedy EM on the questions no stage trains on is higher after RL than for the
  warm start, over the same questions;
* **resumed**: the run resumed from the step-N checkpoint and logged step N+1;
* **plots written**: the five PNGs of ``python -m train.plot``;
* **no collapse alarm**: the collapse warning (docs/training.md#collapse-warning) raised no ALARM on this
  healthy run (a WATCH is shown, not failed).

Each check is one :class:`Check` (name, passed, what was measured); nothing here imports verl or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from train.toy.learnable_task import reward_rise

#: steps averaged at each end of the run
WINDOW = 3
#: the smallest rise of the mean reward (last WINDOW steps minus first WINDOW) that counts as learning
MIN_RISE = 0.10
#: what ``python -m train.plot RUN`` writes into RUN/plots (train/trainer/plots.py)
PLOTS = ("reward.png", "search.png", "llds.png", "lld.png", "warning.png")
#: the per-step level of the collapse warning (0 OK, 1 WATCH, 2 ALARM; train/monitor/detectors.py)
WARNING = "search_r1/warning"
_PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'}  {self.name}: {self.detail}"


def exact_match(rows: dict[str, dict]) -> float:
    """Mean ``em`` of an evaluation file's rows (``{uid: row}``)."""
    if not rows:
        raise ValueError("no evaluated question")
    return sum(float(r["em"]) for r in rows.values()) / len(rows)


def reward_check(steps: dict[int, dict], trained: int) -> Check:
    """The rise over steps 1..``trained`` (a resumed step appended after them is not part of the run)."""
    name = "reward rose"
    run = {s: m for s, m in steps.items() if 1 <= s <= trained}
    try:
        first, last = reward_rise(run, WINDOW)
    except ValueError as e:
        return Check(name, False, str(e))
    rise = last - first
    return Check(name, rise >= MIN_RISE, f"mean of the first {WINDOW} steps {first:.3f}, of the last {WINDOW} "
                                         f"{last:.3f} ({rise:+.3f}; needs >= {MIN_RISE:+.2f})")


def em_check(before: dict[str, dict], after: dict[str, dict]) -> Check:
    name = "held-out EM rose"
    if not before or set(before) != set(after):
        return Check(name, False, f"the two evaluations cover different questions ({len(before)} before, "
                                  f"{len(after)} after, {len(set(before) ^ set(after))} not in both)")
    b, a = exact_match(before), exact_match(after)
    return Check(name, a > b, f"warm start {b:.3f} -> after RL {a:.3f} ({len(after)} questions no stage trained on, "
                              f"greedy)")


def resume_check(steps: dict[int, dict], trained: int) -> Check:
    name = "resumed"
    missing = [s for s in range(1, trained + 2) if s not in steps]
    if missing:
        return Check(name, False, f"the metrics file lacks step(s) {missing[:5]} of 1-{trained + 1}")
    return Check(name, True, f"steps 1-{trained} and, after resuming from the step-{trained} checkpoint, "
                             f"step {trained + 1}")


def plots_check(plot_dir: Path) -> Check:
    name = "plots written"
    bad = []
    for p in PLOTS:
        path = plot_dir / p
        if not path.is_file() or path.stat().st_size < 1000 or path.read_bytes()[:8] != _PNG:
            bad.append(p)
    if bad:
        return Check(name, False, f"missing or not a PNG in {plot_dir}: {', '.join(bad)}")
    return Check(name, True, f"{', '.join(PLOTS)} in {plot_dir}")


def alarm_check(steps: dict[int, dict], trained: int) -> Check:
    name = "no collapse alarm"
    run = {s: m for s, m in steps.items() if 1 <= s <= trained + 1 and "critic/score/mean" in m}
    if not any(WARNING in m for m in run.values()):
        return Check(name, False, f"no step logged {WARNING} (collapse_warning.enable=false?)")
    alarms = [s for s in sorted(run) if run[s].get(WARNING, 0) >= 2]
    watches = [s for s in sorted(run) if run[s].get(WARNING, 0) == 1]
    seen = f"WATCH at steps {watches}" if watches else "no WATCH"
    if alarms:
        return Check(name, False, f"ALARM at steps {alarms} of a run that learns ({seen}): a false alarm; the "
                                  f"trainer's 'collapse warning:' lines in the log name the signals")
    return Check(name, True, f"{len(run)} steps, no ALARM ({seen})")


def demo_checks(steps: dict[int, dict], trained: int, before: dict[str, dict], after: dict[str, dict],
                plot_dir: Path) -> list[Check]:
    """Every check of the demo, in the order the demo ran the stages."""
    return [reward_check(steps, trained), resume_check(steps, trained), em_check(before, after),
            plots_check(plot_dir), alarm_check(steps, trained)]
