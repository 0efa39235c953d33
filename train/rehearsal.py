"""python -m train.rehearsal: The CPU rehearsal of the training launchers: ``REHEARSAL=cpu bash scripts/train_llds.sh``.

The shipped preset, plus ``configs/rehearsal/cpu.yaml`` (composed after it as ``+rehearsal=cpu``),
plus the batch sizes this module prints. Only what a CPU machine and a tiny model force changes
(:data:`CHANGES`); updates per rollout batch, samples per prompt, KL, clipping, top_p, turns,
token packing, LLDS, validation cadence, checkpointing and logging stay the preset's.
``tests/test_rehearsal_on_cpu.py`` composes every preset with and without the overlay and checks
that the keys that differ are exactly these.

    python -m train.rehearsal PRESET [--ranks 2] [--nodes 1]    # prints the batch-size overrides
"""

from __future__ import annotations

import argparse
import sys

from train.errors import ConfigError, exit_on_error

#: every key the rehearsal may change, and why (prefix match on the dotted key). The FSDP strategy is not
#: one: the presets use FSDP2 on every platform (configs/_base.yaml), so CI's rehearsal runs theirs.
CHANGES = {
    "actor_rollout_ref.actor.fsdp_config.model_dtype": "fp32 weights",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.": "fp32 compute: the hf rollout samples in fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": "no torch.compile (Triton) on CPU",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "2,048-token packed micro-batches: SDPA's masked math "
                                                          "kernel on CPU costs the square of a micro-batch's tokens",
    "actor_rollout_ref.ref.": "the reference model follows the actor (dtype, no compile, token cap)",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "follows the actor's token cap",
    "actor_rollout_ref.rollout.name": "hf: the batched transformers engine (no vLLM in the CPU environment)",
    "actor_rollout_ref.rollout.agent.num_workers": "1 agent-loop worker per node (2 cores; verl places them "
                                                   "round-robin, so every node runs rollouts)",
    "critic.fsdp.": "fp32, no compile, as the actor",
    "critic.ppo_max_token_len_per_gpu": "2,048-token packed micro-batches, as the actor",
    "critic.ppo_infer_max_token_len_per_gpu": "2,048-token packed micro-batches, as the actor",
    "critic.forward_max_token_len_per_gpu": "follows critic.ppo_max_token_len_per_gpu",
    "data.dataloader_num_workers": "0 (2 cores)",
    "data.max_prompt_length": "512 tokens: a tiny model",
    "data.max_response_length": "512 tokens: a tiny model",
    "search_r1.max_turn_tokens": "32 tokens per generation: a tiny model",
    "search_r1.max_obs_tokens": "96 observation tokens: a tiny model",
    "search_r1.expect_corpus": "any: the rehearsal searches the bundled sample (or a test's corpus), not wiki-18",
    "reward.num_workers": "1 reward worker (2 cores)",
    "trainer.n_gpus_per_node": "2 ranks (gloo workers), the smallest multi-rank shape",
    "trainer.nnodes": "1 node",
    "ray_kwargs.ray_init.num_cpus": "8 logical Ray CPUs for the workers",
    "ray_kwargs.ray_init.include_dashboard": "no dashboard",
    "data.train_batch_size": "scaled down, same number of optimizer updates per rollout batch (sizes below)",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "scaled down: the smallest that splits over the ranks",
    # keys verl's own config derives from the ones above (interpolations)
    "actor_rollout_ref.rollout.n_gpus_per_node": "follows trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.prompt_length": "follows data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "follows data.max_response_length",
    "critic.ppo_mini_batch_size": "follows the actor's",
    "distillation.teacher_models.teacher_model.inference.": "follows the rollout (no teacher is used)",
}


def is_documented(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in CHANGES)


def batch_sizes(train_batch: int, mini_batch: int, n: int, ranks: int = 2) -> tuple[int, int]:
    """(train_batch_size, ppo_mini_batch_size) in prompts: the preset's number of optimizer updates
    per rollout batch, each mini-batch the fewest prompts whose ``x n`` trajectories split over ranks."""
    if ranks < 1 or n < 1 or mini_batch < 1:
        raise ValueError(f"ranks, rollout.n and ppo_mini_batch_size must be >= 1 (got {ranks}, {n}, {mini_batch})")
    if train_batch % mini_batch:
        raise ValueError(f"the preset's data.train_batch_size={train_batch} is not a multiple of "
                         f"ppo_mini_batch_size={mini_batch}")
    updates = train_batch // mini_batch
    mini = next(m for m in range(1, ranks + 1) if (m * n) % ranks == 0)
    return updates * mini, mini


def overrides(preset: str, ranks: int = 2, nodes: int = 1) -> list[str]:
    import importlib.util
    import os

    from hydra import compose, initialize_config_dir

    from train import CONFIG_DIR

    # The presets find verl's config dir as pkg://verl.trainer.config, which imports verl (~8 s of a
    # launcher's start-up); the same folder named by path reads the same files without the import.
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"verl is not installed in {sys.executable} (pip install -e '.[dev]' or '.[gpu]')")
    verl_dir = list(spec.submodule_search_locations)[0]
    search = f"hydra.searchpath=[file://{os.path.join(verl_dir, 'trainer', 'config')}]"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=preset, overrides=[search])
    actor = cfg.actor_rollout_ref.actor
    train, mini = batch_sizes(cfg.data.train_batch_size, actor.ppo_mini_batch_size, cfg.actor_rollout_ref.rollout.n,
                              ranks)
    if nodes < 1 or ranks % nodes:
        raise ValueError(f"--nodes must be >= 1 and divide --ranks (got --nodes {nodes}, --ranks {ranks})")
    workers = [f"actor_rollout_ref.rollout.agent.num_workers={nodes}"] if nodes > 1 else []
    return [f"data.train_batch_size={train}", f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}", *workers]


@exit_on_error
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.rehearsal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1, help="nodes of the run: one agent-loop worker on each")
    args = ap.parse_args(argv)
    try:
        print(" ".join(["+rehearsal=cpu", *overrides(args.preset, args.ranks, args.nodes)]))
    except Exception as e:  # an unknown preset, a preset that does not divide
        raise ConfigError(f"rehearsal of {args.preset!r}: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
