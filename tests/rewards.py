"""Test-only verl reward: a deterministic pseudo-random 0/1 score per response.

A random tiny policy never answers right, so with the real EM reward every advantage is 0 and
the paths that depend on positive-advantage rows (the LLDS gate and its per-action diagnostics)
are never exercised. This score is a fixed function of the response text (stable across runs),
so GRPO groups get mixed rewards and both advantage signs occur on every rank.
"""

import hashlib


def hashed_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return float(hashlib.sha256(solution_str.encode("utf-8", "replace")).digest()[0] % 2)
