"""Displacement on the same tokens: a fixed probe of successful trajectories re-scored after every update.

``actor/llds/logp_pos`` averages the positive tokens of *this* step's rollouts, so its level moves with
the prompt mix and with how many responses succeeded. The probe removes both: the first successful
trajectories of the run (score > 0.5 and advantage > 0, collected until ``rows`` are held) are kept, and
after each update the actor scores the very same tokens again. Logged every step (NaN until the probe is
full; fixed keys on every rank):

- ``probe/logp``: mean log-probability of the probe's action tokens under the updated policy;
- ``probe/logp_answer``: the same on the final answer spans;
- ``probe/drop``, ``probe/drop_answer``: the first scoring minus the current one (nats per token;
  positive: the likelihood of answers once found correct has been displaced).

Costs one forward pass over ``rows`` sequences per step (the old-log-prob pass does the batch's).

Once full, the probe (its rows and its first scoring) is saved beside the checkpoints (:data:`FILE`) and a
resumed run, a rollback included, re-scores the same rows: a run resumed after its reward fell has no
successful trajectory left to build a new probe from. The reference stays when the run resumes at or
after the step it was scored at, and is scored again otherwise (a rollback to before it: the displacement
is then counted from the branch the run goes on with). A run that starts from scratch removes the file
(:func:`train.trainer.launch.launch`).
"""

from __future__ import annotations

import math

FILE = "collapse_probe.pt"  # in trainer.default_local_dir
KEYS = ("probe/logp", "probe/logp_answer", "probe/drop", "probe/drop_answer")
_FIELDS = ("input_ids", "attention_mask", "position_ids", "prompts", "responses", "response_mask", "answer_mask")


class DisplacementProbe:
    def __init__(self, rows: int, world_size: int = 1):
        self.rows = int(rows)
        self.world_size = max(int(world_size), 1)
        self.data = None  # the probe's rows (a DataProto), padded to a multiple of the world size
        self.held = 0
        self.reference: dict[str, float] = {}
        self.reference_step: int | None = None  # the training step whose update the reference was scored after

    def collect(self, batch) -> None:
        """Keep the batch's successful positive-advantage rows until ``rows`` are held."""
        if self.rows <= 0 or self.held >= self.rows:
            return
        from verl import DataProto

        t = batch.batch
        scores = t["token_level_scores"].float().sum(-1)
        positive = ((t["advantages"] > 0) & (t["response_mask"] > 0)).any(-1)
        idx = [i for i in (((scores > 0.5) & positive).nonzero().flatten().tolist())][: self.rows - self.held]
        if not idx:
            return
        keys = [k for k in _FIELDS if k in t.keys()]
        rows = batch.select(batch_keys=keys, non_tensor_batch_keys=[], meta_info_keys=["temperature"]).select_idxs(idx)
        self.data = rows if self.data is None else DataProto.concat([self.data, rows])
        self.held += len(idx)

    def batch(self):
        """The probe's rows repeated up to a multiple of the world size (each rank gets some);
        statistics use the first ``held`` rows only."""
        from verl import DataProto

        pad = (-self.held) % self.world_size
        if not pad:
            return self.data
        return DataProto.concat([self.data] + [self.data.select_idxs([i % self.held]) for i in range(pad)])

    def score(self, log_probs, step: int | None = None) -> dict[str, float]:
        """The probe's statistics from the actor's log-probs of :meth:`batch` (``[rows, T]``)."""
        t = self.data.batch
        lp = log_probs[: self.held].float()
        action = t["response_mask"] > 0
        answer = (t["answer_mask"] > 0) & action if "answer_mask" in t.keys() else action[:, :0]
        out = {"probe/logp": _mean(lp, action), "probe/logp_answer": _mean(lp, answer) if answer.numel() else math.nan}
        if not self.reference:
            self.reference, self.reference_step = dict(out), step
        out["probe/drop"] = self.reference["probe/logp"] - out["probe/logp"]
        out["probe/drop_answer"] = self.reference["probe/logp_answer"] - out["probe/logp_answer"]
        return out

    def save(self, path: str) -> None:
        """The full probe (rows, reference) to ``path``, written atomically."""
        import os

        import torch

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp"
        torch.save({"rows": self.rows, "held": self.held, "data": self.data, "reference": self.reference,
                    "reference_step": self.reference_step}, tmp)
        os.replace(tmp, path)

    def restore(self, path: str, resumed_at: int) -> bool:
        """The probe saved at ``path`` by an earlier attempt of this run, when it holds as many rows as this
        one asks for; False (and nothing changed) otherwise. ``resumed_at``: the step the run resumed from
        (0: the start); a reference scored after a later step is dropped, to be scored again."""
        import torch

        try:
            saved = torch.load(path, weights_only=False)
        except FileNotFoundError:
            return False
        if saved.get("rows") != self.rows or not saved.get("reference"):
            return False
        self.data, self.held = saved["data"], int(saved["held"])
        step = saved.get("reference_step")
        if step is not None and step <= resumed_at:
            self.reference, self.reference_step = dict(saved["reference"]), step
        return True

    @property
    def full(self) -> bool:
        return self.rows > 0 and self.held >= self.rows


def _mean(values, mask) -> float:
    n = int(mask.sum())
    return float((values * mask).sum() / n) if n else math.nan


def empty() -> dict[str, float]:
    return {**{k: math.nan for k in KEYS}, "timing_s/probe": 0.0}
