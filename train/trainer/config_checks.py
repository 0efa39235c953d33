"""The trainer config checked before anything starts: our blocks (``search_r1``, ``llds``,
``lld_alarm``, ``checkpoints``), the batch split verl needs, names of our classes that moved, and
verl's own validation. Every problem is a :class:`~train.errors.ConfigError` naming the key."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from train.errors import ConfigError

#: dotted names a config may hold that moved to packages (an old override fails here, naming the new one)
MOVED = {
    "train.agent_loop.SearchR1AgentLoopManager": "train.search_r1.rollout_manager.SearchR1AgentLoopManager",
    "train.agent_loop": "train.search_r1.agent_loop",
    "pkg://train.reward": "pkg://train.search_r1.reward",
    "train.reward": "train.search_r1.reward",
}


def check_moved_names(config: DictConfig) -> None:
    """A config value naming one of our modules at its old path (a user's override or an old preset)."""
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(node, str):
            yield path, node

    for key, value in walk(OmegaConf.to_container(config, resolve=False), ""):
        for old, new in MOVED.items():
            if value == old or value.startswith(old + ".") or value.startswith(old + ":"):
                raise ConfigError(f"{key}={value!r}: {old} moved to {new}; use {value.replace(old, new, 1)!r}")


def check_replicas(url: str, nnodes: int, workers: int) -> None:
    """A retriever replica on every node (``{node_ip}`` in the URL) serves the rollouts of the agent workers
    on its node, and verl places those workers round-robin over the nodes: fewer workers than nodes
    leaves some nodes' replicas without a search."""
    from train.search_r1.config import NODE_IP

    if NODE_IP in url and workers < nnodes:
        raise ConfigError(
            f"search_r1.retriever_url={url!r} searches a replica on each of trainer.nnodes={nnodes} nodes, but "
            f"actor_rollout_ref.rollout.agent.num_workers={workers} agent workers run rollouts on {workers} of them "
            f"(verl places them round-robin): set num_workers to a multiple of {nnodes}")


def check_config(config: DictConfig) -> None:
    """Our blocks and verl's own validation; raises with the offending key."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from train.llds.alarm import AlarmConfig
    from train.llds.loss import LLDSConfig
    from train.search_r1.config import SearchConfig
    from train.trainer import checkpoint_store as checkpoints
    from train.trainer.batch_geometry import check_split
    from train.trainer.preflight import checkpoint_preflight

    check_moved_names(config)
    SearchConfig.from_config(OmegaConf.to_container(config.get("search_r1") or {}, resolve=True))
    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    checkpoint_preflight(config.trainer.nnodes, config.trainer.default_local_dir)
    checkpoints.check_config(OmegaConf.to_container(config.get("checkpoints") or {}, resolve=True))
    AlarmConfig.from_dict(OmegaConf.to_container(config.get("lld_alarm") or {}, resolve=True))
    if not isinstance(config.trainer.get("save_on_sigterm", False), bool):
        raise ConfigError(f"trainer.save_on_sigterm must be true or false, got {config.trainer.save_on_sigterm!r}")
    if config.trainer.get("use_v1", True):
        raise ConfigError("trainer.use_v1 must be false: train.main drives verl's RayPPOTrainer")
    actor = config.actor_rollout_ref.actor
    ranks = config.trainer.n_gpus_per_node * config.trainer.nnodes
    rollout = config.actor_rollout_ref.rollout
    workers = int((rollout.get("agent") or {}).get("num_workers") or 1)
    check_replicas(str((config.get("search_r1") or {}).get("retriever_url") or ""), int(config.trainer.nnodes),
                   workers)
    check_split(config.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n, ranks,
                actor.get("ppo_micro_batch_size_per_gpu"), bool(actor.get("use_dynamic_bsz")), workers=workers)
    if llds.enable:
        n = config.actor_rollout_ref.rollout.n
        updates = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        if updates * config.actor_rollout_ref.actor.ppo_epochs < 2:
            raise ConfigError(
                f"llds.enable needs >= 2 optimizer updates per rollout batch (LLDS is zero in the first): "
                f"data.train_batch_size={config.data.train_batch_size} / actor.ppo_mini_batch_size="
                f"{config.actor_rollout_ref.actor.ppo_mini_batch_size} gives {updates} (rollout.n={n})")
    try:
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"verl's config check: {e}") from None
