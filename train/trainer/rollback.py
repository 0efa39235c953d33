"""``collapse_warning.action=rollback``: when the collapse warning raises its alarm, the run goes back to
the newest complete checkpoint saved before the warning began (its first step at WATCH or above) and
trains on from there with the actor's learning rate times ``rollback_lr_scale``, at most
``max_rollbacks`` times; after that the alarm stops the run as ``action=stop`` does (exit 5).

What a rollback does, in the driver (:func:`train.trainer.launch.launch`), between two of verl's
``run_ppo``: the checkpoints after the target step move to ``rolled_back_<n>/`` beside them and the
metrics file is copied to ``<metrics>.rolled_back_<n>`` (nothing is deleted); the tracker names the
target step (none: the run starts again from the model it started from). The run resumes the target's
weights and data position only (``actor.checkpoint.load_contents=[model]``): the optimizer state and the
learning-rate schedule start fresh, since verl's checkpoint would restore the old learning rate with
them, and the Adam moments carry the update that led into the collapse. The trainer keeps the target
checkpoint through ``checkpoints.keep_last`` pruning while a warning is open
(:meth:`train.trainer.ray_trainer.SearchR1Trainer._save_checkpoint`).

No verl import: the plan is plain file moves and config values, tested on CPU without training.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from train.trainer import checkpoint_store


@dataclass(frozen=True)
class Stop:
    """What the trainer wrote when the alarm stopped it (:data:`train.trainer.sigterm.COLLAPSE_FLAG`)."""
    text: str                  # the alarm's description, for the user
    step: int                  # the step the alarm was raised at
    began: Optional[int]       # the first step of the warning that led to it (WATCH or above, unbroken)

    def to_json(self) -> str:
        return json.dumps({"text": self.text, "step": self.step, "began": self.began})

    @classmethod
    def read(cls, path: str) -> Optional["Stop"]:
        """The stop recorded at ``path`` (the file is removed), or None when there is none."""
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        os.unlink(path)
        try:
            d = json.loads(raw)
            return cls(str(d["text"]), int(d["step"]), None if d.get("began") is None else int(d["began"]))
        except (ValueError, KeyError, TypeError):  # a flag written by hand or by an older trainer: its text
            return cls(raw.strip(), -1, None)


@dataclass(frozen=True)
class Rollback:
    """One rollback: where the run goes back to, what was set aside, the learning rate it continues with."""
    attempt: int               # 1 for the first rollback of the run
    target: int                # the step resumed from; 0: the model the run started from
    moved: tuple[int, ...]     # the steps whose checkpoints moved to ``aside``
    aside: str                 # <root>/rolled_back_<attempt>
    metrics_copy: Optional[str]
    lr: float

    def describe(self, stop: Stop, old_lr: float, scale: float, max_rollbacks: int) -> str:
        where = f"global_step_{self.target}" if self.target else "the model the run started from"
        moved = (f"; checkpoints of steps {', '.join(map(str, self.moved))} moved to {self.aside}"
                 if self.moved else "")
        copy = f"; the metrics so far copied to {self.metrics_copy}" if self.metrics_copy else ""
        return (f"collapse warning: rolling back ({self.attempt} of collapse_warning.max_rollbacks={max_rollbacks}): "
                f"{stop.text}; the warning began at step {stop.began}; resuming from {where} with the actor's "
                f"learning rate {old_lr:g} x {scale:g} = {self.lr:g} and a fresh optimizer state{moved}{copy}")


def target_step(root: str, began: Optional[int]) -> int:
    """The newest complete checkpoint before step ``began`` (0: none, start over from the model)."""
    if began is None:
        return 0
    for step in reversed(checkpoint_store.saved_steps(root)):
        if step < began and not checkpoint_store.problems(checkpoint_store.step_dir(root, step)):
            return step
    return 0


def set_aside(root: str, stop: Stop, attempt: int, metrics: Optional[str], lr: float, scale: float) -> Rollback:
    """Move the checkpoints after the target step aside and copy the metrics file; returns the plan.
    The tracker names the target (removed when the target is the start)."""
    target = target_step(root, stop.began)
    aside = os.path.join(root, f"rolled_back_{attempt}")
    moved = [s for s in checkpoint_store.saved_steps(root) if s > target]
    if moved:
        os.makedirs(aside, exist_ok=True)
    for s in moved:
        os.replace(checkpoint_store.step_dir(root, s), os.path.join(aside, f"global_step_{s}"))
    tracker = os.path.join(root, checkpoint_store.TRACKER)
    if target:
        checkpoint_store.write_tracker(root, target)
    elif os.path.exists(tracker):
        os.makedirs(aside, exist_ok=True)
        os.replace(tracker, os.path.join(aside, checkpoint_store.TRACKER))
    copy = None
    if metrics and os.path.isfile(metrics) and os.path.getsize(metrics):
        copy = f"{metrics}.rolled_back_{attempt}"
        shutil.copy2(metrics, copy)
        if not target:  # from the start: the file begins anew (the copy holds the history)
            os.unlink(metrics)
    return Rollback(attempt, target, tuple(moved), aside, copy, lr * scale)


def keep_for_rollback(root: str, began: Optional[int]) -> list[int]:
    """The checkpoint a rollback would go back to while a warning is open (kept through pruning)."""
    target = target_step(root, began)
    return [target] if target else []
