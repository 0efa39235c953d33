"""Ray for a training run: a Ray instance of its own, or the cluster ``RAY_ADDRESS`` names, with
verl's runtime env and the variables every worker needs on every node."""

from __future__ import annotations

import os

import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from train.errors import ConfigError


def init_ray(config: DictConfig, cpu: bool) -> str:
    """Start Ray for this run (both paths; verl's ``run_ppo`` then finds it initialised): verl's runtime
    env merged with ``ray_kwargs.ray_init.runtime_env``, as ``run_ppo`` does. A run starts its own Ray
    instance (``address="local"``) unless ``RAY_ADDRESS`` or ``ray_kwargs.ray_init.address`` names a
    cluster: a bare ``ray.init()`` joins whatever cluster runs on the machine (one left by
    ``multinode.sh``, say). Joining, the resource arguments Ray refuses are dropped. CPU runs get one
    logical Ray GPU slot per rank and the platform variables in every worker. Returns the line printed."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    rollout = config.actor_rollout_ref.rollout
    if rollout.get("full_determinism"):  # what run_ppo sets before its ray.init, for the runtime env
        os.environ.update(VERL_FULL_DETERMINISM="1", VLLM_BATCH_INVARIANT="1", PYTHONHASHSEED=str(rollout.seed))
    init = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True) or {}
    env = OmegaConf.to_container(OmegaConf.merge(get_ppo_ray_runtime_env(config), init.pop("runtime_env", None) or {}))
    env.setdefault("env_vars", {})
    if cpu:
        for key in ("VERL_PLATFORM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_MODE", "TOKENIZERS_PARALLELISM",
                    "VLLM_CPU_KVCACHE_SPACE"):
            if os.environ.get(key) is not None:
                env["env_vars"][key] = os.environ[key]
    address = init.pop("address", None) or os.environ.get("RAY_ADDRESS")
    init = {k: v for k, v in init.items() if v is not None}
    if address:
        dropped = sorted(k for k in ("num_cpus", "num_gpus", "resources", "object_store_memory", "include_dashboard")
                         if init.pop(k, None) is not None)
        # inside a Ray job (multinode.sh submits one) Ray merges the job's runtime env with this one and,
        # by default, refuses a variable named in both; merged per variable, this run's value wins
        os.environ.setdefault("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
        line = (f"ray: joining the Ray cluster at {address} (" + ("ray_kwargs.ray_init.address" if
                config.ray_kwargs.get("ray_init", {}).get("address") else "RAY_ADDRESS") + ")"
                + (f"; its own resources apply ({', '.join(dropped)} not passed)" if dropped else ""))
    else:
        address = "local"
        if cpu:
            init["num_gpus"] = config.trainer.n_gpus_per_node * config.trainer.nnodes
        line = ("ray: starting a Ray instance for this run (a cluster already running on this machine is not "
                "joined; set RAY_ADDRESS to join one)")
    print(line, flush=True)
    try:
        ray.init(address=address, **init, runtime_env=env)
    except Exception as e:
        chain, cause = [], e
        while cause is not None and len(chain) < 10:
            chain.append(str(cause))
            cause = cause.__cause__ or cause.__context__
        if address != "local" and "InvalidAuthToken" in " ".join(chain) and os.environ.get("RAY_AUTH_MODE") != "token":
            raise ConfigError(f"the Ray cluster at {address} authenticates by token (Ray's default for "
                              f"`ray start`) and this process sent none: set RAY_AUTH_MODE=token (the token is read "
                              f"from ~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)") from None
        raise
    return line


def forward_env_to_ray(config: DictConfig, keys) -> None:
    """Copy these environment variables (when set) into the Ray runtime env, so that workers on every
    node see them (a local Ray inherits the driver's environment; a running cluster does not)."""
    env = {k: os.environ[k] for k in keys if os.environ.get(k) is not None}
    if not env:
        return
    with open_dict(config):
        init = config.ray_kwargs.setdefault("ray_init", {})
        init["runtime_env"] = OmegaConf.merge(init.get("runtime_env") or {}, {"env_vars": env})
