"""Rewards for Search-R1 training: a verl custom reward function.

Wire it with ``reward.custom_reward_function.path=pkg://train.search_r1.reward`` and
``reward.custom_reward_function.name=compute_score`` (the presets do). ``solution_str`` is the
decoded response *including* observations; the answer is taken from the generated text only
(:func:`train.search_r1.protocol.extract_answer`).

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

from train.search_r1 import protocol

METRICS = ("em", "sub_em", "f1")


def check_golds(golds: Any, where: str, field: str = "target") -> list[str]:
    """The one rule for gold answers (data preparation, the training preflight, the reward and the
    evaluator): a non-empty list of non-blank strings. A blank gold ("") makes an empty or
    punctuation-only answer ("", ".") score 1.0 and every real answer 0.0.

    A gold that is not blank but normalises to nothing ("A", "The", "."; articles and punctuation
    are dropped) is kept, as Search-R1's EM keeps it (the test sets have such rows);
    :func:`empty_once_normalised` finds them for a warning."""
    if isinstance(golds, str):
        golds = [golds]
    if hasattr(golds, "tolist"):  # numpy arrays from parquet
        golds = golds.tolist()
    if not isinstance(golds, (list, tuple)) or not golds:
        raise ValueError(
            f"{where}: row has no gold answer ({field!r} must be a non-empty list of strings, got {golds!r})")
    for i, g in enumerate(golds):
        if not isinstance(g, str):
            raise ValueError(f"{where}: {field}[{i}] is {type(g).__name__} {g!r}, not a string "
                             "(write numbers and booleans as the text the answer must match)")
        if not g.strip():
            raise ValueError(f"{where}: {field}[{i}] is empty ({g!r}): an empty or punctuation-only answer would "
                             f"score 1.0 and every real answer 0.0")
    return [g.strip() for g in golds]


def empty_once_normalised(golds: Iterable[str]) -> list[str]:
    """The golds that normalise to nothing: an empty answer matches them."""
    return [g for g in golds if not protocol.normalize_answer(g)]


def gold_answers(ground_truth: Any, where: str = "ground_truth") -> list[str]:
    """Accept a string, a list of strings, or ``{"target": ...}`` (also numpy arrays); checked by
    :func:`check_golds`."""
    if isinstance(ground_truth, dict):
        if "target" not in ground_truth:
            raise ValueError(f"{where}: ground_truth dict has no 'target' key: {sorted(ground_truth)}")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    return check_golds(ground_truth, where)


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
    uid = extra_info.get("uid") if isinstance(extra_info, dict) else None
    golds = gold_answers(ground_truth, f"reward for row uid {uid!r} (data_source {data_source!r})")
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
