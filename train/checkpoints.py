"""Bounded checkpoint retention: ``checkpoints.keep_last`` newest steps plus the ``keep_steps`` that
``scripts/reproduce_paper.sh`` evaluates (a 3B checkpoint with fp32 weights and Adam state is ~37 GB;
saving every 50 of 1,005 steps without pruning is ~0.8 TB).

verl's own ``trainer.max_actor_ckpt_to_keep`` keeps the newest N only, so it would delete the step the
paper evaluates (650 of 1,005); this prunes whole ``global_step_N`` folders after each save instead.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Iterable

STEP_DIR = re.compile(r"^global_step_(\d+)$")


def saved_steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(root) if (m := STEP_DIR.match(name))
                  and os.path.isdir(os.path.join(root, name)))


def latest_step(root: str) -> int | None:
    path = os.path.join(root, "latest_checkpointed_iteration.txt")
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def prune(root: str, keep_last: int | None, keep_steps: Iterable[int] = ()) -> list[int]:
    """Delete ``root/global_step_N`` folders except the newest ``keep_last``, the ``keep_steps`` and
    the one ``latest_checkpointed_iteration.txt`` names. ``keep_last`` None or <= 0 keeps all.
    Returns the steps deleted."""
    if not keep_last or keep_last <= 0:
        return []
    steps = saved_steps(root)
    keep = set(steps[-keep_last:]) | {int(s) for s in keep_steps}
    latest = latest_step(root)
    if latest is not None:
        keep.add(latest)
    removed = [s for s in steps if s not in keep]
    for s in removed:
        shutil.rmtree(os.path.join(root, f"global_step_{s}"), ignore_errors=True)
    return removed


def check_config(block) -> tuple[int, list[int]]:
    block = dict(block or {})
    unknown = set(block) - {"keep_last", "keep_steps"}
    if unknown:
        raise ValueError(f"unknown checkpoints config keys: {sorted(unknown)} (known: keep_last, keep_steps)")
    keep_last = block.get("keep_last")
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 0):
        raise ValueError(f"checkpoints.keep_last must be an integer >= 0 (0 or null keeps all), got {keep_last!r}")
    steps = block.get("keep_steps") or []
    if isinstance(steps, (int, str)):
        steps = [steps]
    try:
        steps = [int(s) for s in steps]
    except (TypeError, ValueError):
        raise ValueError(f"checkpoints.keep_steps must be a list of step numbers, got {block.get('keep_steps')!r}")
    return keep_last, steps
