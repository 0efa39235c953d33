"""Rollout-batch geometry: prompts per rollout batch and per mini-batch that give exactly the
released runs' 10 optimizer updates per batch on a given number of ranks.

verl counts ``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` in prompts, multiplies the
mini-batch by ``rollout.n`` and splits it evenly over the data-parallel ranks, so the mini-batch's
trajectories must divide by the rank count. The released runs used 512 prompts x 5 in 10 mini-batches
of 256 trajectories on 4 GPUs; 512 prompts cannot give 10 equal mini-batches in verl, so this picks
the mini-batch (in prompts) closest to 51.2 that divides: 52 on 1, 2 and 4 ranks, 48 on 8.

    python -m train.geometry --ranks 8 [--n 5] [--updates 10]   # prints hydra overrides
"""

from __future__ import annotations

import argparse
import sys

TARGET_PROMPTS = 512


def ten_update_geometry(ranks: int, n: int = 5, updates: int = 10, target: int = TARGET_PROMPTS) -> tuple[int, int]:
    """(train_batch_size, ppo_mini_batch_size) in prompts, closest to ``target`` prompts per batch,
    with ``updates`` mini-batches whose ``mini * n`` trajectories divide by ``ranks``."""
    if ranks < 1 or n < 1 or updates < 1:
        raise ValueError(f"ranks, n and updates must be >= 1 (got {ranks}, {n}, {updates})")
    ideal = target / updates
    candidates = [m for m in range(1, 4 * int(ideal) + 2) if (m * n) % ranks == 0]
    if not candidates:
        raise ValueError(f"no mini-batch of <= {4 * int(ideal) + 1} prompts splits over {ranks} ranks with n={n}")
    mini = min(candidates, key=lambda m: (abs(m - ideal), m))
    return mini * updates, mini


def check_split(train_batch: int, mini_batch: int, n: int, ranks: int, micro: int | None = None,
                dynamic: bool = False, prefix: str = "actor_rollout_ref.actor") -> None:
    """Raise ValueError naming the numbers when verl could not split the batch evenly."""
    if train_batch % mini_batch:
        raise ValueError(f"data.train_batch_size={train_batch} is not a multiple of {prefix}.ppo_mini_batch_size="
                         f"{mini_batch}: the last optimizer update would get a partial mini-batch")
    per_rank, rem = divmod(mini_batch * n, ranks)
    if rem:
        good = ten_update_geometry(ranks, n, max(train_batch // mini_batch, 1))
        raise ValueError(f"{prefix}.ppo_mini_batch_size={mini_batch} prompts x rollout.n={n} = {mini_batch * n} "
                         f"trajectories do not split over {ranks} ranks; e.g. data.train_batch_size={good[0]} "
                         f"{prefix}.ppo_mini_batch_size={good[1]} (python -m train.geometry --ranks {ranks})")
    if not dynamic and micro and per_rank % micro:
        raise ValueError(f"{prefix}.ppo_micro_batch_size_per_gpu={micro} does not divide the {per_rank} trajectories "
                         f"each rank gets per mini-batch ({mini_batch} prompts x {n} / {ranks} ranks)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.geometry", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, required=True, help="GPUs in all (n_gpus_per_node x nnodes)")
    ap.add_argument("--n", type=int, default=5, help="rollout.n (default 5)")
    ap.add_argument("--updates", type=int, default=10, help="optimizer updates per rollout batch (default 10)")
    args = ap.parse_args(argv)
    try:
        train, mini = ten_update_geometry(args.ranks, args.n, args.updates)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"data.train_batch_size={train} actor_rollout_ref.actor.ppo_mini_batch_size={mini}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
