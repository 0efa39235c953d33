"""The trainer config checked before anything starts: every key our code reads (our blocks, :data:`OUR_BLOCKS`;
``trainer.save_on_sigterm``; the reward function's ``reward_kwargs``), the batch split verl needs, names of our
classes that moved, and verl's own validation. Every problem is a :class:`~train.errors.ConfigError` naming the key."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from train.errors import ConfigError

#: the top-level blocks of a trainer config that our code reads and checks (verl ignores them)
OUR_BLOCKS = ("search_r1", "llds", "drift_penalty", "collapse_warning", "checkpoints", "flat_steps")

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


#: where the presets' reward function lives (configs/_base.yaml, reward.custom_reward_function)
OUR_REWARD = ("pkg://train.search_r1.reward", "compute_score")
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"


def check_reward(config: DictConfig) -> None:
    """``reward.custom_reward_function.reward_kwargs``: verl hands them to the reward function in every reward
    worker, where a misspelt metric fails (and a misspelt key is ignored) after Ray starts. For our
    ``compute_score``: each key is one of its settings, ``metric`` one of its metrics; for a user's function
    (loaded here, as verl loads it): each key is one of its parameters, unless it takes ``**kwargs``."""
    import inspect

    fn = (config.get("reward") or {}).get("custom_reward_function") or {}
    kwargs = fn.get("reward_kwargs") or {}
    kwargs = OmegaConf.to_container(kwargs, resolve=True) if OmegaConf.is_config(kwargs) else kwargs
    if not isinstance(kwargs, dict):
        raise ConfigError(f"{REWARD_KWARGS} must be a mapping of keyword arguments, got {kwargs!r}")
    if not kwargs:
        return
    path, name = fn.get("path"), fn.get("name")
    if not path:
        raise ConfigError(f"{REWARD_KWARGS} is set ({sorted(kwargs)}) but reward.custom_reward_function.path is "
                          f"not: nothing would read them")
    if (str(path), str(name)) == OUR_REWARD:
        from train.search_r1 import reward

        params = inspect.signature(reward.compute_score).parameters
        known = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise ConfigError(f"{REWARD_KWARGS}.{unknown[0]}: not a setting of {path}:{name} (its settings: "
                              f"{', '.join(known)})")
        if "metric" in kwargs and kwargs["metric"] not in reward.METRICS:
            raise ConfigError(f"{REWARD_KWARGS}.metric={kwargs['metric']!r}: the reward's metric is one of "
                              f"{', '.join(reward.METRICS)}")
        if not isinstance(kwargs.get("format_score", False), bool):
            raise ConfigError(f"{REWARD_KWARGS}.format_score must be true or false, got {kwargs['format_score']!r}")
        for key in ("structure_format_score", "final_format_score", "retrieval_score"):
            value = kwargs.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{REWARD_KWARGS}.{key} must be a number, got {value!r}")
        return
    try:
        from verl.utils.import_utils import load_extern_object

        params = inspect.signature(load_extern_object(module_path=str(path), object_name=str(name))).parameters
    except Exception as e:  # noqa: BLE001  (a user's file: whatever it raises, named with the key)
        raise ConfigError(f"reward.custom_reward_function: cannot load {name!r} from {path!r} "
                          f"({type(e).__name__}: {e})") from None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ConfigError(f"{REWARD_KWARGS}.{unknown[0]}: {path}:{name} has no parameter {unknown[0]!r} "
                          f"(its parameters: {', '.join(params)})")


def check_config(config: DictConfig) -> None:
    """Our blocks and verl's own validation; raises with the offending key."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from train.llds.drift import DriftConfig
    from train.llds.loss import LLDSConfig
    from train.monitor.detectors import WarningConfig
    from train.search_r1.config import SearchConfig
    from train.trainer import checkpoint_store, corpus_check
    from train.trainer.batch_geometry import check_split
    from train.trainer.preflight import checkpoint_preflight

    check_moved_names(config)
    search = SearchConfig.of(config)
    corpus_check.parse(search.expect_corpus, "search_r1.expect_corpus")
    try:  # our blocks' own checks raise ValueError naming the key: a ConfigError here (one line, exit 2)
        llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
        drift = DriftConfig.from_dict(OmegaConf.to_container(config.get("drift_penalty") or {}, resolve=True))
        checkpoint_store.check_config(OmegaConf.to_container(config.get("checkpoints") or {}, resolve=True))
        if config.get("lld_alarm") is not None:
            raise ConfigError("lld_alarm: replaced by collapse_warning (docs/training.md#collapse-warning); "
                              "remove the lld_alarm block or its overrides")
        WarningConfig.from_dict(OmegaConf.to_container(config.get("collapse_warning") or {}, resolve=True))
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(str(e)) from None
    check_reward(config)
    checkpoint_preflight(config.trainer.nnodes, config.trainer.default_local_dir)
    flat = config.get("flat_steps") or {}
    unknown = set(flat) - {"skip_update"}
    if unknown or not isinstance(flat.get("skip_update", False), bool):
        raise ConfigError(f"flat_steps: the one key is skip_update, true or false; got {dict(flat)!r}")
    if not isinstance(config.trainer.get("save_on_sigterm", False), bool):
        raise ConfigError(f"trainer.save_on_sigterm must be true or false, got {config.trainer.save_on_sigterm!r}")
    if config.trainer.get("use_v1", True):
        raise ConfigError("trainer.use_v1 must be false: train.main drives verl's RayPPOTrainer")
    if (config.algorithm.get("filter_groups") or {}).get("enable"):  # read by verl's v1 trainer only
        raise ConfigError("algorithm.filter_groups.enable=true has no effect here: verl 0.9.1 filters groups only in "
                          "its v1 trainer, and train.main drives RayPPOTrainer; every group is trained on "
                          "(search_r1/flat_groups logs the share whose rewards are all equal; "
                          "flat_steps.skip_update=true skips the update of a step where every group is so)")
    actor = config.actor_rollout_ref.actor
    ranks = config.trainer.n_gpus_per_node * config.trainer.nnodes
    rollout = config.actor_rollout_ref.rollout
    workers = int((rollout.get("agent") or {}).get("num_workers") or 1)
    check_replicas(str((config.get("search_r1") or {}).get("retriever_url") or ""), int(config.trainer.nnodes),
                   workers)
    check_split(config.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n, ranks,
                actor.get("ppo_micro_batch_size_per_gpu"), bool(actor.get("use_dynamic_bsz")), workers=workers)
    for name, on in (("llds", llds.enable), ("drift_penalty", drift.enable)):
        if not on:
            continue
        n = config.actor_rollout_ref.rollout.n
        updates = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        if updates * config.actor_rollout_ref.actor.ppo_epochs < 2:
            raise ConfigError(
                f"{name}.enable needs >= 2 optimizer updates per rollout batch (it is zero in the first): "
                f"data.train_batch_size={config.data.train_batch_size} / actor.ppo_mini_batch_size="
                f"{config.actor_rollout_ref.actor.ppo_mini_batch_size} gives {updates} (rollout.n={n})")
    try:
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"verl's config check: {e}") from None
