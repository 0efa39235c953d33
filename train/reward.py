"""Rewards for Search-R1 training: a verl custom reward function.

Wire it with ``reward.custom_reward_function.path=pkg://train.reward`` and
``reward.custom_reward_function.name=compute_score`` (the presets do). ``solution_str`` is the
decoded response *including* observations; the answer is taken from the generated text only
(:func:`train.protocol.extract_answer`).

Score variants (``reward_kwargs``):

- ``metric="em"`` (default): 1.0 when the normalised answer equals any gold answer, else 0.0.
- ``metric="sub_em"``: 1.0 when a normalised gold answer is contained in the prediction.
- ``metric="f1"``: the best token F1 against the gold answers.
- ``format_score=True``: Search-R1's format reward (``qa_em_format``) around the chosen metric,
  with ``structure_format_score`` (0.2), ``final_format_score`` (0.1) and ``retrieval_score`` (0).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional

from train import protocol

METRICS = ("em", "sub_em", "f1")


def gold_answers(ground_truth: Any) -> list[str]:
    """Accept a string, a list of strings, or ``{"target": ...}`` (also numpy arrays)."""
    if isinstance(ground_truth, dict):
        if "target" not in ground_truth:
            raise ValueError(f"ground_truth dict has no 'target' key: {sorted(ground_truth)}")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, (str, int, float)):
        return [str(ground_truth)]
    if hasattr(ground_truth, "tolist"):
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, Iterable):
        answers = [str(g) for g in ground_truth]
        if answers:
            return answers
    raise ValueError(f"ground_truth must be a string, a non-empty list or {{'target': [...]}}, got {ground_truth!r}")


def em(prediction: str, golds: Iterable[str]) -> float:
    p = protocol.normalize_answer(prediction)
    return float(any(p == protocol.normalize_answer(g) for g in golds))


def sub_em(prediction: str, golds: Iterable[str]) -> float:
    p = protocol.normalize_answer(prediction)
    return float(any((g := protocol.normalize_answer(gold)) and g in p for gold in golds))


def f1(prediction: str, golds: Iterable[str]) -> float:
    pred_tokens = protocol.normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        gold_tokens = protocol.normalize_answer(gold).split()
        common = Counter(pred_tokens) & Counter(gold_tokens)
        overlap = sum(common.values())
        if overlap == 0:
            continue
        precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _retrieval_correct(response: str, golds: Iterable[str]) -> bool:
    blocks = [protocol.normalize_answer(b) for b in protocol.information_blocks(response)]
    return any(protocol.normalize_answer(g) in b for g in golds for b in blocks if g.strip())


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Optional[dict] = None,
    *,
    metric: str = "em",
    format_score: bool = False,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    **kwargs,
) -> dict:
    """verl custom reward: ``score`` plus ``em``, ``f1``, ``sub_em``, ``has_answer``, ``num_searches``."""
    if metric not in METRICS:
        raise ValueError(f"reward metric must be one of {METRICS}, got {metric!r}")
    golds = gold_answers(ground_truth)
    answer = protocol.extract_answer(solution_str)
    values = {"em": 0.0, "sub_em": 0.0, "f1": 0.0}
    if answer is not None:
        values = {"em": em(answer, golds), "sub_em": sub_em(answer, golds), "f1": f1(answer, golds)}
    score = values[metric]
    if format_score:
        valid = protocol.is_valid_sequence(solution_str)
        if answer is not None and score > 0:
            score = score if valid else max(0.0, score - structure_format_score)
        elif valid:
            score = structure_format_score
            if _retrieval_correct(solution_str, golds):
                score += retrieval_score
        elif answer is not None:
            score = final_format_score
        else:
            score = 0.0
    return {
        "score": float(score),
        **values,
        "has_answer": float(answer is not None),
        "num_searches": float(protocol.count_searches(solution_str)),
    }
