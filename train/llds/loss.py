"""The patched actor loss: verl's own ``ppo_loss`` plus the LLDS regulariser.

Installed on the actor with ``actor_rollout_wg.set_loss_fn(make_actor_loss(actor_cfg, llds_cfg))``
(see :mod:`train.main`). Everything verl computes (clipped PG, entropy bonus, KL loss, their
metrics) is verl's; this adds ``lambda * sum(penalty) / N`` where N is verl's global token
count for ``token-mean`` (``batch_num_tokens``, times ``dp_size`` like verl's own aggregation),
so the gradient does not depend on the micro-batch split.

Tensors read from the micro-batch besides verl's: ``answer_mask`` ``[B, R]`` (1 on the final
``<answer>...</answer>`` span, from the agent loop) and, for the adaptive LLDS-MA weight,
``batch_valid_searches`` ``[B]`` (the rollout batch's mean number of valid searches).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Optional

import torch

from train.llds.drift import DriftConfig, drift_penalty
from train.llds.penalty import GATES, adaptive_answer_weight, llds_penalty_and_gate, llds_stats, stats_ratios

#: Prefix of the raw diagnostic sums and counts the loss emits (SUM-aggregated, the same keys on every
#: micro-batch and rank); :func:`finish_llds_metrics` turns them into ratios once per step.
RAW = "llds_raw/"


@dataclass
class LLDSConfig:
    enable: bool = True
    lam: float = 0.2
    gate: str = "action"
    # LLDS-MA: weight on the final answer span. A number (1.0 = plain LLDS), or "adaptive".
    answer_weight: Any = 1.0
    # Adaptive rule: "paper" (beta = min(V / V_B, 1)) or "released" (the released code's rule).
    adaptive_rule: str = "paper"
    valid_search_baseline: float = 2.0
    answer_lambda: float = 0.2  # the released code's answer coefficient (rule "released")
    # What V counts: "parsed" <search> actions (the released code) or "executed" searches.
    valid_search_count: str = "parsed"

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "LLDSConfig":
        d = dict(d or {})
        if "lambda" in d:
            d["lam"] = d.pop("lambda")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown llds config keys: {sorted(unknown)}")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.gate not in GATES:
            raise ValueError(f"llds.gate must be one of {GATES}, got {self.gate!r}")
        if not (isinstance(self.lam, (int, float)) and self.lam >= 0):
            raise ValueError(f"llds.lambda must be a number >= 0, got {self.lam!r}")
        if self.answer_weight != "adaptive" and not (
                isinstance(self.answer_weight, (int, float)) and self.answer_weight >= 0):
            raise ValueError(f"llds.answer_weight must be a number >= 0 or 'adaptive', got {self.answer_weight!r}")
        if self.valid_search_count not in ("parsed", "executed"):
            raise ValueError(f"llds.valid_search_count must be 'parsed' or 'executed', got {self.valid_search_count!r}")
        if self.adaptive_rule not in ("paper", "released"):
            raise ValueError(f"llds.adaptive_rule must be 'paper' or 'released', got {self.adaptive_rule!r}")

    def resolve_answer_weight(self, mean_valid_searches: Optional[float]) -> float:
        if self.answer_weight != "adaptive":
            return float(self.answer_weight)
        if mean_valid_searches is None:
            raise ValueError("llds.answer_weight=adaptive needs 'batch_valid_searches' in the batch "
                             "(use the search_r1 agent loop manager)")
        return adaptive_answer_weight(mean_valid_searches, self.adaptive_rule, self.valid_search_baseline,
                                      self.lam, self.answer_lambda)


def llds_term(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, answer_mask: Optional[torch.Tensor], cfg: LLDSConfig,
              answer_weight: float, dp_size: int = 1,
              batch_num_tokens: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``lambda * sum(penalty) / N * dp_size`` with verl's token-mean normaliser, and the gate."""
    penalty, open_ = llds_penalty_and_gate(old_log_prob, log_prob, advantages, response_mask, gate=cfg.gate,
                                           answer_mask=answer_mask, answer_weight=answer_weight)
    n = batch_num_tokens if batch_num_tokens is not None else response_mask.sum().clamp(min=1)
    return cfg.lam * penalty.sum() / n * dp_size, open_


def drift_term(old_log_prob, log_prob, advantages, response_mask, cfg: DriftConfig, dp_size: int = 1,
               batch_num_tokens: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SAPO's drift penalty (:mod:`train.llds.drift`) on one micro-batch, normalised so that the
    micro-batches and ranks of a mini-batch add up to its mean over the non-negative-advantage tokens:
    ``w * sum / (N * share) * dp_size`` with N verl's global token count and ``share`` this
    micro-batch's share of A >= 0 tokens (exact when the shares agree; on one micro-batch, the plain mean)."""
    term, n_pen, n_counted = drift_penalty(old_log_prob, log_prob, advantages, response_mask,
                                           threshold=cfg.threshold, weight=cfg.weight)
    if batch_num_tokens is None or not int(n_counted):
        return term, n_pen
    share = n_counted / (response_mask > 0).sum().clamp(min=1)
    return term * n_counted / (batch_num_tokens * share) * dp_size, n_pen


def llds_ppo_loss(config, model_output, data, dp_group=None, *, llds: LLDSConfig, positions: int = 4,
                  drift: Optional[DriftConfig] = None):
    """Signature of verl's loss functions: ``(config, model_output, data, dp_group)``."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    fields = ["response_mask", "old_log_probs", "advantages"]
    for extra in ("answer_mask", "batch_valid_searches"):
        if extra in data.keys():
            fields.append(extra)
    td = data.select(*fields).to_padded_tensor()
    response_mask = td["response_mask"].to(log_prob.dtype)
    answer_mask = td["answer_mask"] if "answer_mask" in fields else None
    valid = float(td["batch_valid_searches"].float().mean()) if "batch_valid_searches" in fields else None
    answer_weight = llds.resolve_answer_weight(valid)

    dp_size = data["dp_size"] if "dp_size" in data.keys() else 1
    batch_num_tokens = data["batch_num_tokens"] if "batch_num_tokens" in data.keys() else None
    old_log_prob, advantages = td["old_log_probs"], td["advantages"]
    term, open_ = llds_term(old_log_prob, log_prob, advantages, response_mask, answer_mask, llds, answer_weight,
                            dp_size=dp_size or 1, batch_num_tokens=batch_num_tokens)

    # The diagnostics (likelihood of positive-advantage tokens per position, what the gate would
    # open) are logged with LLDS off too: GRPO runs are the ones the collapse alarm is for.
    # Sums and counts with a fixed key set: verl gathers each key's per-micro-batch values from every
    # rank and refuses keys seen a different number of times on different ranks.
    stats = llds_stats(old_log_prob, log_prob.detach(), advantages, response_mask, gate=llds.gate,
                       answer_mask=answer_mask, open_gate=open_, positions=positions)
    metrics.update(Metric.from_dict({RAW + k: v for k, v in stats.items()}, aggregation=AggregationType.SUM))
    if drift is not None and drift.enable:
        dterm, n_pen = drift_term(old_log_prob, log_prob, advantages, response_mask, drift, dp_size=dp_size or 1,
                                  batch_num_tokens=batch_num_tokens)
        aggregation = AggregationType.SUM if batch_num_tokens is not None else AggregationType.MEAN
        metrics["drift/penalty"] = Metric(value=dterm.detach(), aggregation=aggregation)
        metrics["drift/penalised_tokens"] = Metric(value=float(n_pen), aggregation=AggregationType.SUM)
        loss = loss + dterm
    if not llds.enable:
        return loss, metrics  # verl's loss (plus the drift penalty when asked)

    aggregation = AggregationType.SUM if batch_num_tokens is not None else AggregationType.MEAN
    metrics["llds/penalty"] = Metric(value=term.detach(), aggregation=aggregation)
    metrics["llds/lambda"] = llds.lam
    metrics["llds/answer_weight"] = answer_weight
    return loss + term, metrics


def finish_llds_metrics(metrics: dict, prefix: str = "actor/") -> dict:
    """Replace the raw ``llds_raw/*`` sums and counts of one step (each a value or a list of
    per-mini-batch values) with the logged ratios ``llds/d_mean_preserved``, ..., ``llds/logp_pos_a{k}``."""
    raw = prefix + RAW
    total = {}
    for key in [k for k in metrics if k.startswith(raw)]:
        v = metrics.pop(key)
        total[key[len(raw):]] = float(sum(v) if isinstance(v, (list, tuple)) else v)
    if total:
        metrics.update({f"{prefix}llds/{k}": v for k, v in stats_ratios(total).items()})
    return metrics


def make_actor_loss(actor_config, llds_config: LLDSConfig, positions: int = 4,
                    drift_config: Optional[DriftConfig] = None):
    """What the driver passes to ``actor_rollout_wg.set_loss_fn``; ``positions``: how many action
    positions the per-position log-likelihood diagnostic tracks (max_turns + 1 generations);
    ``drift_config``: SAPO's drift penalty (``drift_penalty:``), off unless enabled."""
    return partial(llds_ppo_loss, config=actor_config, llds=llds_config, positions=positions, drift=drift_config)
