"""LLDS: Lazy Likelihood-Displacement Suppression (arXiv 2512.04220), pure torch.

No verl import here: this is the math, tested on its own. :mod:`train.llds.loss` adds it to verl's
PPO/GRPO loss.

Notation (all tensors ``[B, T]``, one row per response, T response positions):

- ``d = old_log_prob - log_prob``: positive where the token's likelihood fell since rollout.
- *preserved* token: ``response_mask == 1`` and ``advantages >= 0`` (correct and untrained
  responses, the set Y_pre of the paper).
- *action*: a maximal run of consecutive preserved tokens in a row (one generated turn, since
  observation tokens have ``response_mask == 0``).

The penalty on a preserved token that passes the gate is ``w * max(0, d)``, else 0, with
``w = answer_weight`` on the final answer span (``answer_mask == 1``) and 1 elsewhere (LLDS-MA).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

GATES = ("action", "response", "token")


def preserved_mask(response_mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: response tokens of responses with non-negative advantage."""
    return (response_mask > 0) & (advantages >= 0)


def action_ids(mask: torch.Tensor) -> torch.Tensor:
    """Number the maximal runs of True in each row of a bool ``[B, T]`` mask.

    Returns a long ``[B, T]`` tensor: runs are numbered 1, 2, ... in row-major order (unique
    across the batch); positions outside any run get 0.
    """
    mask = mask.bool()
    prev = torch.zeros_like(mask)
    prev[:, 1:] = mask[:, :-1]
    starts = mask & ~prev
    ids = torch.cumsum(starts.flatten().long(), 0).view_as(mask)
    return torch.where(mask, ids, torch.zeros_like(ids))


def _run_sums(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over each run; index 0 collects the positions outside runs. Sized by the
    largest possible run id (no device-to-host sync)."""
    sums = torch.zeros(ids.numel() + 1, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, ids.flatten(), values.flatten())


def llds_gate(
    d: torch.Tensor, preserved: torch.Tensor, gate: str = "action"
) -> torch.Tensor:
    """Bool ``[B, T]``: preserved tokens whose gate is open. Computed without gradient."""
    if gate not in GATES:
        raise ValueError(f"LLDS gate must be one of {GATES}, got {gate!r}")
    with torch.no_grad():
        d = torch.where(preserved, d.detach(), torch.zeros_like(d))
        if gate == "token":
            return preserved.clone()
        if gate == "response":
            return preserved & (d.sum(dim=-1, keepdim=True) > 0)
        ids = action_ids(preserved)
        per_run = _run_sums(d, ids)
        return preserved & (per_run[ids] > 0)


def llds_token_penalty(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gate: str = "action",
    answer_mask: Optional[torch.Tensor] = None,
    answer_weight: float = 1.0,
) -> torch.Tensor:
    """Per-token LLDS penalty ``[B, T]`` (differentiable in ``log_prob``).

    ``gate``: ``"action"`` (LLDS-A, the paper's default) opens when the signed sum of d over the
    token's action is > 0; ``"response"`` (LLDS-R) when the signed sum over the row's preserved
    tokens is > 0; ``"token"`` always. Gate decisions carry no gradient. Non-finite inputs on one
    row never make the penalty of another row non-finite.
    """
    return llds_penalty_and_gate(old_log_prob, log_prob, advantages, response_mask, gate=gate,
                                 answer_mask=answer_mask, answer_weight=answer_weight)[0]


def llds_penalty_and_gate(old_log_prob, log_prob, advantages, response_mask, *, gate="action",
                          answer_mask=None, answer_weight=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`llds_token_penalty` plus the bool gate it used (for :func:`llds_stats`)."""
    shapes = {t.shape for t in (old_log_prob, log_prob, advantages, response_mask)}
    if answer_mask is not None:
        shapes.add(answer_mask.shape)
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"LLDS inputs must all be [B, T] of one shape, got {sorted(map(tuple, shapes))}")
    d = old_log_prob.detach() - log_prob
    preserved = preserved_mask(response_mask, advantages)
    open_ = llds_gate(d, preserved, gate)
    penalty = torch.clamp(d, min=0.0)
    if answer_mask is not None:
        penalty = torch.where(answer_mask > 0, penalty * float(answer_weight), penalty)
    return torch.where(open_, penalty, torch.zeros_like(penalty)), open_


#: The sums and counts :func:`llds_stats` always emits besides the per-position ones, and the
#: ratio each pair becomes (:func:`stats_ratios`).
RATIOS = {
    "d_mean_preserved": ("d_pos_sum", "n_pos"),
    "d_mean_negative": ("d_neg_sum", "n_neg"),
    "gated_action_frac": ("gated_actions", "n_actions"),
    "gated_response_frac": ("gated_responses", "n_responses"),
    "logp_pos_answer": ("logp_pos_answer_sum", "logp_pos_answer_n"),
    # SAPO's "importance sampling drift" (arXiv 2603.10069): the share of preserved tokens whose ratio
    # pi/pi_old fell below RATIO_LOW; PPO's clip never acts on a falling ratio when A >= 0, so
    # pg_clipfrac does not see it. 0 in a step's first mini-batch (on-policy: ratio 1).
    "ratio_low_share": ("ratio_low_n", "ratio_n"),
}

#: The ratio below which a preserved token counts as drifting (``ratio_low_share``).
RATIO_LOW = 0.5


def stat_keys(positions: int) -> list[str]:
    """Every key :func:`llds_stats` returns for ``positions`` action positions, in order."""
    keys = [k for pair in RATIOS.values() for k in pair]
    for j in range(1, positions + 1):
        keys += [f"logp_pos_a{j}_sum", f"logp_pos_a{j}_n"]
    return keys


@torch.no_grad()
def llds_stats(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    gate: str = "action",
    answer_mask: Optional[torch.Tensor] = None,
    open_gate: Optional[torch.Tensor] = None,
    positions: int = 4,
) -> dict[str, float]:
    """Death-spiral diagnostics for one micro-batch, as sums and counts (:func:`stats_ratios` turns
    the totals over micro-batches and ranks into means).

    The key set is fixed (:func:`stat_keys`): every micro-batch on every rank returns the same keys,
    zeros where it has nothing to count, which verl's metric gathering across ranks requires.
    Keys: ``d_pos_sum``/``n_pos`` (d over preserved tokens), ``d_neg_sum``/``n_neg`` (d over
    negative-advantage tokens), ``gated_actions``/``n_actions``, ``gated_responses``/
    ``n_responses`` (preserved ones), ``logp_pos_answer_sum``/``_n`` (log-prob of positive-advantage
    tokens in the answer span) and ``logp_pos_a{k}_sum``/``_n`` for k = 1..``positions``: the same at
    action position k of its response (actions after the last position are counted in the last).
    """
    if positions < 1:
        raise ValueError(f"llds_stats: positions must be >= 1, got {positions}")
    d = (old_log_prob - log_prob).float()
    resp = response_mask > 0
    preserved = preserved_mask(response_mask, advantages)
    negative = resp & (advantages < 0)
    open_ = llds_gate(d, preserved, gate) if open_gate is None else open_gate
    ids = action_ids(preserved)
    starts = preserved.clone()
    starts[:, 1:] &= ~preserved[:, :-1]  # first token of each action
    gated_run = torch.zeros(ids.numel() + 1, dtype=torch.bool, device=d.device)
    gated_run[ids[open_]] = True
    rows = preserved.any(dim=-1)
    lp = log_prob.float()
    positive = resp & (advantages > 0)
    ans = positive & (answer_mask > 0) if answer_mask is not None else torch.zeros_like(positive)
    values = [torch.where(preserved, d, 0.0).nansum(), preserved.sum(),
              torch.where(negative, d, 0.0).nansum(), negative.sum(),
              gated_run[1:].sum(), starts.sum(),
              (open_.any(dim=-1) & rows).sum(), rows.sum(),
              torch.where(ans, lp, 0.0).nansum(), ans.sum(),
              (preserved & (-d < math.log(RATIO_LOW))).sum(), preserved.sum()]

    # Action position within its row: 1 for the first run, 2 for the second..., capped at `positions`.
    pos_ids = action_ids(positive)
    big = torch.full_like(pos_ids, torch.iinfo(torch.long).max)
    first_id = torch.where(positive, pos_ids, big).min(-1, keepdim=True).values
    position = torch.where(positive, (pos_ids - first_id + 1).clamp(max=positions), torch.zeros_like(pos_ids))
    k = torch.arange(1, positions + 1, device=d.device).view(-1, 1, 1)
    sel = position.unsqueeze(0) == k  # [K, B, T]
    sums = torch.where(sel, lp.unsqueeze(0), 0.0).nansum(dim=(1, 2))
    counts = sel.sum(dim=(1, 2))
    for j in range(positions):
        values += [sums[j], counts[j]]
    flat = torch.stack([v.float() for v in values]).tolist()  # one host transfer
    return dict(zip(stat_keys(positions), flat))


def stats_ratios(total: dict[str, float]) -> dict[str, float]:
    """Totals of :func:`llds_stats` keys (summed over micro-batches, ranks, mini-batches) -> the
    logged means, named ``d_mean_preserved``, ..., ``logp_pos_a{k}`` and ``logp_pos`` (all positions);
    0 where the count is 0, except ``logp_pos``: NaN."""

    def ratio(num: str, den: str) -> float:
        return total.get(num, 0.0) / total[den] if total.get(den) else 0.0

    out = {name: ratio(num, den) for name, (num, den) in RATIOS.items()}
    pos_sum = pos_n = 0.0
    for key in total:
        if key.startswith("logp_pos_a") and key.endswith("_sum"):
            name = key[: -len("_sum")]
            out[name] = ratio(key, f"{name}_n")
            pos_sum, pos_n = pos_sum + total[key], pos_n + total.get(f"{name}_n", 0.0)
    # every positive-advantage action token, all positions together (the collapse alarm's signal);
    # NaN, not 0, in a step without one (e.g. every reward 0), so that no curve or alarm reads a value
    out["logp_pos"] = pos_sum / pos_n if pos_n else float("nan")
    return out


def merge_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Add up :func:`llds_stats` dicts (e.g. over micro-batches), then turn them into means
    (keys prefixed ``llds/``)."""
    total: dict[str, float] = {}
    for s in stats:
        for k, v in s.items():
            total[k] = total.get(k, 0.0) + v
    return {f"llds/{k}": v for k, v in stats_ratios(total).items()}


def adaptive_answer_weight(mean_valid_searches: float, rule: str = "paper", baseline: float = 2.0,
                           lam: float = 0.2, answer_lambda: float = 0.2) -> float:
    """LLDS-MA answer weight beta from the batch mean number of valid searches V.

    - ``"paper"``: beta = min(V / V_B, 1) with V_B = ``baseline`` (2), as the paper states.
    - ``"released"``: the released code's rule: the answer coefficient is
      ``min(answer_lambda * max(V - 1, 0), lam)``, i.e. beta = that / lam.
    """
    v = max(float(mean_valid_searches), 0.0)
    if rule == "paper":
        if baseline <= 0:
            raise ValueError("adaptive answer weight: baseline V_B must be > 0")
        return min(v / baseline, 1.0)
    if rule == "released":
        if lam <= 0:
            raise ValueError("adaptive answer weight: lambda must be > 0")
        return min(answer_lambda * max(v - 1.0, 0.0), lam) / lam
    raise ValueError(f"adaptive answer weight rule must be 'paper' or 'released', got {rule!r}")
