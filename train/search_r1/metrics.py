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
