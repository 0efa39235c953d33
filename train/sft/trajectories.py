"""Warm-start trajectories from a training split, with a real retriever.

For each question: one search with the question itself, the retriever's top-k passages as the
observation (formatted and cut as the agent loop does), then the gold answer. A question is kept only
when a gold answer appears in what the retriever returned, so no trajectory answers from nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

from train.search_r1 import protocol

#: the thoughts written before the search and before the answer
SEARCH_THOUGHT = "I need to find this in Wikipedia."
ANSWER_THOUGHT = "The passages give the answer."


def supported_answer(golds: Sequence[str], contents: Sequence[str]) -> Optional[str]:
    """The first gold answer whose normalized text appears in the normalized passages (None: none does)."""
    text = " " + protocol.normalize_answer(" ".join(contents)) + " "
    for g in golds:
        n = protocol.normalize_answer(g)
        if n and f" {n} " in text:
            return g
    return None


def retrieved_trajectories(rows: Iterable[tuple[str, Sequence[str]]], search: Callable[[list[str]], list[list[str]]],
                           count_tokens: Callable[[str], int], obs_tokens: int = 500,
                           batch: int = 64) -> tuple[list, dict]:
    """``rows``: (question, gold answers); ``search(queries)`` -> passages' contents per query.
    Returns the trajectories (:data:`train.sft.supervised.Trajectory`) and counts (kept, unsupported)."""
    rows = [(q.strip(), golds) for q, golds in rows]  # the query searched is the one the search turn writes
    out, unsupported = [], 0
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        for (q, golds), contents in zip(chunk, search([q for q, _ in chunk])):
            answer = supported_answer(golds, contents)
            if answer is None:
                unsupported += 1
                continue
            out.append((q, [(protocol.search_turn(q, SEARCH_THOUGHT), True),
                            (protocol.format_observation(contents, max_tokens=obs_tokens, count_tokens=count_tokens),
                             False),
                            (protocol.answer_turn(answer, ANSWER_THOUGHT), True)]))
    return out, {"questions": len(rows), "kept": len(out), "unsupported": unsupported}
