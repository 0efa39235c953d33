"""The drift penalty of SAPO, *Search Agent Policy Optimization* ("Improving Search Agent with One Line of
Code", arXiv 2603.10069), pure torch. Not verl's ``loss_mode="sapo"``, which is another method (Soft
Adaptive Policy Optimization, arXiv 2511.20347: a sigmoid gate on the ratio); here the block is called
``drift_penalty`` so that the two are never confused.

SAPO's diagnosis ("importance sampling distribution drift"): in GRPO the ratio ``r = pi / pi_old`` of
tokens of good responses can fall far below 1 within one rollout batch, and PPO's clip never acts on a
falling ratio when the advantage is positive. Its fix, on top of the clipped GRPO loss::

    w * mean over the action tokens of responses with A >= 0 of  (-log r) * 1[r <= t]

- ``-log r = log pi_old - log pi``: the k1 estimate of KL(pi_old || pi) on that token;
- only tokens whose ratio fell to ``t`` or below are penalised; the others count in the mean with 0;
- the mean runs over the action tokens (``response_mask``) of the non-negative-advantage responses,
  not over the whole batch as LLDS's ``lambda * sum / N`` does;
- there is no answer-span weight (LLDS-MA's).

With ``t < 1`` it is LLDS's token gate with a margin of ``-ln t``; ``w`` and LLDS's ``lambda`` are not
comparable (other normalisers). The paper's values of ``t`` and ``w`` are not public (searched
2026-12-04: abstract, summaries, the first author's SE-Search code); the defaults are ours and say why
in :class:`DriftConfig`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class DriftConfig:
    enable: bool = False
    # t: the lower edge of PPO's clip band (1 - clip_ratio with verl's 0.2): the penalty takes over
    # exactly where the clip would have acted had the advantage been negative.
    threshold: float = 0.8
    # w: LLDS's lambda (0.2), so that the two arms pull with the same coefficient per penalised token
    # before their normalisers differ (SAPO's mean over fewer tokens makes it the stronger).
    weight: float = 0.2

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "DriftConfig":
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"drift_penalty: unknown keys {unknown} (known: enable, threshold, weight)")
        cfg = cls(**d)
        if not isinstance(cfg.enable, bool):
            raise ValueError(f"drift_penalty.enable must be true or false, got {cfg.enable!r}")
        if not (isinstance(cfg.threshold, (int, float)) and 0 < cfg.threshold <= 1):
            raise ValueError(f"drift_penalty.threshold must lie in (0, 1], got {cfg.threshold!r}")
        if not (isinstance(cfg.weight, (int, float)) and cfg.weight >= 0):
            raise ValueError(f"drift_penalty.weight must be a number >= 0, got {cfg.weight!r}")
        return cfg


def drift_penalty(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                  response_mask: torch.Tensor, *, threshold: float = 0.8,
                  weight: float = 0.2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(term, n_penalised, n_counted)``: the penalty (a scalar, differentiable in ``log_prob``), how many
    tokens it penalised and how many its mean ran over. All inputs ``[B, T]``; a response's advantage is
    read on its tokens (GRPO gives every token of a response the same one). 0 when no response has A >= 0.
    """
    shapes = {t.shape for t in (old_log_prob, log_prob, advantages, response_mask)}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"drift penalty inputs must all be [B, T] of one shape, got {sorted(map(tuple, shapes))}")
    counted = (response_mask > 0) & (advantages >= 0)
    log_ratio = log_prob - old_log_prob.detach()
    penalised = counted & (log_ratio.detach() <= math.log(threshold))
    per_token = torch.where(penalised, -log_ratio, torch.zeros_like(log_ratio))
    n = counted.sum()
    term = weight * per_token.sum() / n.clamp(min=1)
    return term, penalised.sum(), n
