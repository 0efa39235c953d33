"""Per-step statistics of the Search-R1 agent (``search_r1/*`` in the step's metrics), from the
trajectories' extra fields (:class:`~train.search_r1.agent_loop.Trajectory`)."""

from __future__ import annotations

import numpy as np

from train.search_r1.protocol import StopReason

#: the share of trajectories that ended each way (``search_r1/<name>``), per :class:`StopReason`
STOP_SHARES = ((StopReason.ANSWER, "answered"), (StopReason.MAX_TURNS, "stopped_turn_cap"),
               (StopReason.LENGTH, "stopped_length"), (StopReason.EOS, "stopped_eos"))


def search_metrics(batch) -> dict[str, list[float]]:
    """Per-step agent statistics from the trajectories' extra fields (names avoid "min"/"max",
    which verl's reduce_metrics reads as the reduction)."""
    nt = batch.non_tensor_batch
    out: dict[str, list[float]] = {}
    for key, name in (("num_searches", "searches"), ("num_valid_searches", "valid_searches"),
                      ("num_failed_searches", "failed_searches"), ("num_outage_searches", "outage_searches"),
                      ("num_invalid_actions", "invalid_actions"), ("num_gen_turns", "gen_turns"),
                      ("search_failed", "search_failed")):
        if key in nt:
            out[f"search_r1/{name}"] = [float(np.mean([float(v or 0) for v in nt[key]]))]
    if "stop_reason" in nt:
        reasons = list(nt["stop_reason"])
        for reason, name in STOP_SHARES:
            out[f"search_r1/{name}"] = [reasons.count(reason) / max(len(reasons), 1)]
    if "search_queries" in nt:
        out.update(repeated_query_shares(list(nt["search_queries"]), list(nt["uid"]) if "uid" in nt else None))
    return out


def repeated_query_shares(queries: list, groups: list | None = None) -> dict[str, list[float]]:
    """Of a step's searches, the share that repeats a query text sent before in the step
    (``repeated_query_share``), and the share that repeats one of the same question's samples
    (``repeated_query_share_in_question``; ``groups`` are the trajectories' uids). 0 without searches.
    What the retriever's result cache and batch sharing can save (retrieval/batching.py)."""
    rows = [list(q or []) for q in queries]
    sent = [q for r in rows for q in r]
    by_question: dict = {}
    for g, r in zip(groups if groups is not None else range(len(rows)), rows):
        by_question.setdefault(g, []).extend(r)
    within = sum(len(v) - len(set(v)) for v in by_question.values())
    n = max(len(sent), 1)
    return {"search_r1/repeated_query_share": [(len(sent) - len(set(sent))) / n],
            "search_r1/repeated_query_share_in_question": [within / n]}


#: n-gram length of the repetition signal (``search_r1/repetition``)
REPEAT_N = 4


def behaviour_metrics(batch) -> dict[str, list[float]]:
    """What the collapse warning reads of a step's rollouts, beside :func:`search_metrics` (fixed keys,
    every step; docs/training.md#collapse-warning):

    - ``search_r1/reward``: the mean sequence score (the label's input; the warning never reads it);
    - ``search_r1/valid_format``: share of trajectories that ended with an answer and had no invalid action;
    - ``search_r1/sample_nll``: mean negative log-likelihood of the sampled action tokens under the
      policy that sampled them (an entropy estimate from the batch alone);
    - ``search_r1/repetition``: mean share of a response's action-token ``REPEAT_N``-grams that repeat an
      earlier one of the same response;
    - ``search_r1/adv_token_share``: share of action tokens whose advantage is not 0 (0: the step
      carries no learning signal, only the KL and entropy terms move the policy);
    - ``search_r1/flat_groups``: share of question groups whose rewards are all equal, and
      ``search_r1/flat_groups_expected``: that share if every question had the batch's success rate p
      (``p^n + (1 - p)^n``; scores > 0.5 count as successes).
    """

    t = batch.batch
    nt = batch.non_tensor_batch
    mask = t["response_mask"] > 0
    scores = t["token_level_scores"].float().sum(-1)
    out = {"search_r1/reward": [float(scores.mean())]}
    if "stop_reason" in nt:
        invalid = [float(v or 0) for v in nt["num_invalid_actions"]] if "num_invalid_actions" in nt else \
            [0.0] * len(nt["stop_reason"])
        ok = [r == StopReason.ANSWER and bad == 0 for r, bad in zip(nt["stop_reason"], invalid)]
        out["search_r1/valid_format"] = [sum(ok) / max(len(ok), 1)]
    n_tok = mask.sum().clamp(min=1)
    if "old_log_probs" in t:
        out["search_r1/sample_nll"] = [float(-(t["old_log_probs"].float() * mask).sum() / n_tok)]
    if "advantages" in t:
        out["search_r1/adv_token_share"] = [float(((t["advantages"] != 0) & mask).sum() / n_tok)]
    out["search_r1/repetition"] = [repetition(t["responses"], mask)]
    if "uid" in nt:
        groups: dict = {}
        for uid, s in zip(nt["uid"], scores.tolist()):
            groups.setdefault(uid, []).append(s)
        flat = [max(g) == min(g) for g in groups.values()]
        n = round(len(scores) / max(len(groups), 1))
        p = float((scores > 0.5).float().mean())
        out["search_r1/flat_groups"] = [sum(flat) / max(len(flat), 1)]
        out["search_r1/flat_groups_expected"] = [p ** n + (1 - p) ** n]
    return out


def repetition(responses, mask, n: int = REPEAT_N) -> float:
    """Mean over rows of the share of action-token n-grams that repeat an earlier n-gram of the row
    (rows with fewer than n action tokens count 0)."""
    shares = []
    for ids, m in zip(responses.tolist(), mask.tolist()):
        tokens = [i for i, keep in zip(ids, m) if keep]
        grams = [tuple(tokens[j:j + n]) for j in range(len(tokens) - n + 1)]
        shares.append((len(grams) - len(set(grams))) / len(grams) if grams else 0.0)
    return sum(shares) / max(len(shares), 1)
