"""Rollout-batch geometry: the arithmetic of prompts per rollout batch and per mini-batch on a number of
ranks (why 52 or 48 prompts per mini-batch, and what verl and its agent workers require of the split:
the docstring of :mod:`train.geometry`, the command that prints the overrides). :func:`check_split` is
also the config check of every run (:mod:`train.trainer.config_checks`).
"""

from __future__ import annotations

TARGET_PROMPTS = 512
AGENT_WORKERS = 8  # verl's default actor_rollout_ref.rollout.agent.num_workers (the presets keep it)


def ten_update_geometry(ranks: int, n: int = 5, updates: int = 10, target: int = TARGET_PROMPTS,
                        workers: int = AGENT_WORKERS) -> tuple[int, int]:
    """(train_batch_size, ppo_mini_batch_size) in prompts, closest to ``target`` prompts per batch,
    with ``updates`` mini-batches whose ``mini * n`` trajectories divide by ``ranks``, and a batch whose
    trajectories divide by the ``workers`` agent workers."""
    if ranks < 1 or n < 1 or updates < 1 or workers < 1:
        raise ValueError("ranks, n and updates must be >= 1, and agent workers too "
                         f"(got {ranks}, {n}, {updates}, {workers})")
    ideal = target / updates
    candidates = [m for m in range(1, 4 * int(ideal) + 2) if (m * n) % ranks == 0 and (m * updates * n) % workers == 0]
    if not candidates:
        raise ValueError(f"no mini-batch of <= {4 * int(ideal) + 1} prompts splits over {ranks} ranks and {workers} "
                         f"agent workers with n={n}")
    mini = min(candidates, key=lambda m: (abs(m - ideal), m))
    return mini * updates, mini


def check_split(train_batch: int, mini_batch: int, n: int, ranks: int, micro: int | None = None,
                dynamic: bool = False, prefix: str = "actor_rollout_ref.actor", workers: int | None = None) -> None:
    """Raise ValueError naming the numbers when verl could not split the batch evenly (over the
    ranks, the micro-batches and, when given, the ``workers`` agent workers of the rollout)."""
    if workers and (train_batch * n) % workers:
        updates = max(train_batch // mini_batch, 1)
        hint = ""
        try:
            good = ten_update_geometry(ranks, n, updates, workers=workers)
            hint = (f"; e.g. data.train_batch_size={good[0]} {prefix}.ppo_mini_batch_size={good[1]} "
                    f"(python -m train.geometry --ranks {ranks} --n {n} --updates {updates} --agent-workers {workers})")
        except ValueError:
            pass
        raise ValueError(f"data.train_batch_size={train_batch} prompts x rollout.n={n} = "
                         f"{train_batch * n} trajectories "
                         f"do not split over actor_rollout_ref.rollout.agent.num_workers={workers} agent workers (verl "
                         f"splits each rollout batch evenly over them and fails with 'only support equal chunk'){hint}")
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
