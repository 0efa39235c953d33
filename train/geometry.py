"""python -m train.geometry: rollout-batch geometry: prompts per rollout batch and per mini-batch that give exactly the
released runs' 10 optimizer updates per batch on a given number of ranks.

verl counts ``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` in prompts, multiplies the
mini-batch by ``rollout.n`` and splits it evenly over the data-parallel ranks, so the mini-batch's
trajectories must divide by the rank count. The released runs used 512 prompts x 5 in 10 mini-batches
of 256 trajectories on 4 GPUs; 512 prompts cannot give 10 equal mini-batches in verl, so this picks
the mini-batch (in prompts) closest to 51.2 that divides: 52 on 1, 2 and 4 ranks, 48 on 3, 6 and 8.

verl's agent loop manager also splits every rollout batch evenly over its agent workers
(``actor_rollout_ref.rollout.agent.num_workers``, 8 by default; "only support equal chunk" otherwise),
so the batch's trajectories must divide by that count too: 510 prompts x 5 on 3 ranks would not.

    python -m train.geometry --ranks 8 [--n 5] [--updates 10] [--agent-workers 8]   # prints hydra overrides
"""

from __future__ import annotations

import argparse
import sys

from train.errors import ConfigError, exit_on_error
from train.trainer.batch_geometry import AGENT_WORKERS, ten_update_geometry


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.geometry", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, required=True, help="GPUs in all (n_gpus_per_node x nnodes)")
    ap.add_argument("--n", type=int, default=5, help="rollout.n (default 5)")
    ap.add_argument("--updates", type=int, default=10, help="optimizer updates per rollout batch (default 10)")
    ap.add_argument("--agent-workers", type=int, default=AGENT_WORKERS,
                    help=f"actor_rollout_ref.rollout.agent.num_workers (default {AGENT_WORKERS}, verl's)")
    args = ap.parse_args(argv)
    try:
        train, mini = ten_update_geometry(args.ranks, args.n, args.updates, workers=args.agent_workers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    print(f"data.train_batch_size={train} actor_rollout_ref.actor.ppo_mini_batch_size={mini}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
