"""python -m train.checkpoints DIR/global_step_N: is that checkpoint complete (exit 0) or not (exit 1,
with what is wrong)? ``scripts/reproduce_paper.sh`` uses it to decide whether to train. The store
itself (retention, resume, manifests): :mod:`train.trainer.checkpoint_store`.
"""

from __future__ import annotations

import sys

from train.trainer.checkpoint_store import problems


def main(argv=None) -> int:
    """``python -m train.checkpoints DIR/global_step_N``: exit 0 when that checkpoint is complete,
    else print why and exit 1 (``scripts/reproduce_paper.sh`` uses it to decide whether to train)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m train.checkpoints DIR/global_step_N", file=sys.stderr)
        return 2
    bad = problems(args[0])
    for line in bad:
        print(line)
    if not bad:
        print(f"{args[0]}: complete")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
