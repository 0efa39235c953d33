"""Training entry point: verl 0.9.1's PPO/GRPO trainer with the Search-R1 agent loop and LLDS.

    python -m train.main --config-name grpo_llds data.train_files=... actor_rollout_ref.model.path=...

Reading order: :func:`main` validates our blocks and verl's config, then hands
:class:`SearchR1TaskRunner` to verl's ``run_ppo`` (which starts Ray). The runner builds verl's
``RayPPOTrainer`` (a subclass that adds the ``search_r1/*`` agent statistics and the collapse
alarm, :mod:`train.lld_alarm`, to each step's metrics) as verl's own task runner does, starts the
workers, installs the LLDS actor loss with ``set_loss_fn``, and calls ``fit``. With
``VERL_PLATFORM=cpu`` the same loop runs on CPU (:mod:`train.cpu`): Ray gets logical GPU slots and
the workers open their process group on gloo.
"""

from __future__ import annotations

import os
import socket

import hydra
import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.trainer.main_ppo_v0 import BaseTaskRunner

from train import CONFIG_DIR  # re-exported: tests and tools import it from here


def check_config(config: DictConfig) -> None:
    """Our blocks and verl's own validation; raises with the offending key."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from train import checkpoints
    from train.agent_loop import SearchConfig
    from train.geometry import check_split
    from train.lld_alarm import AlarmConfig
    from train.loss import LLDSConfig
    from train.preflight import checkpoint_preflight

    SearchConfig.from_config(OmegaConf.to_container(config.get("search_r1") or {}, resolve=True))
    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    checkpoint_preflight(config.trainer.nnodes, config.trainer.default_local_dir)
    checkpoints.check_config(OmegaConf.to_container(config.get("checkpoints") or {}, resolve=True))
    AlarmConfig.from_dict(OmegaConf.to_container(config.get("lld_alarm") or {}, resolve=True))
    if not isinstance(config.trainer.get("save_on_sigterm", False), bool):
        raise ValueError(f"trainer.save_on_sigterm must be true or false, got {config.trainer.save_on_sigterm!r}")
    if config.trainer.get("use_v1", True):
        raise ValueError("trainer.use_v1 must be false: train.main drives verl's RayPPOTrainer")
    actor = config.actor_rollout_ref.actor
    ranks = config.trainer.n_gpus_per_node * config.trainer.nnodes
    rollout = config.actor_rollout_ref.rollout
    check_split(config.data.train_batch_size, actor.ppo_mini_batch_size, rollout.n, ranks,
                actor.get("ppo_micro_batch_size_per_gpu"), bool(actor.get("use_dynamic_bsz")),
                workers=int((rollout.get("agent") or {}).get("num_workers") or 1))
    if llds.enable:
        n = config.actor_rollout_ref.rollout.n
        updates = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        if updates * config.actor_rollout_ref.actor.ppo_epochs < 2:
            raise ValueError(
                f"llds.enable needs >= 2 optimizer updates per rollout batch (LLDS is zero in the first): "
                f"data.train_batch_size={config.data.train_batch_size} / actor.ppo_mini_batch_size="
                f"{config.actor_rollout_ref.actor.ppo_mini_batch_size} gives {updates} (rollout.n={n})")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def search_metrics(batch) -> dict[str, list[float]]:
    """Per-step agent statistics from the trajectories' extra fields (names avoid "min"/"max",
    which verl's reduce_metrics reads as the reduction)."""
    import numpy as np

    nt = batch.non_tensor_batch
    out: dict[str, list[float]] = {}
    for key, name in (("num_searches", "searches"), ("num_valid_searches", "valid_searches"),
                      ("num_failed_searches", "failed_searches"), ("num_outage_searches", "outage_searches"),
                      ("num_invalid_actions", "invalid_actions"), ("num_gen_turns", "gen_turns"),
                      ("search_failed", "search_failed")):
        if key in nt:
            out[f"search_r1/{name}"] = [float(np.mean([float(v or 0) for v in nt[key]]))]
    if "stop_reason" in nt:
        reasons = list(nt["stop_reason"])
        for reason, name in (("answer", "answered"), ("max_turns", "stopped_turn_cap"),
                             ("length", "stopped_length"), ("eos", "stopped_eos")):
            out[f"search_r1/{name}"] = [reasons.count(reason) / max(len(reasons), 1)]
    if "search_queries" in nt:
        out.update(repeated_query_shares(list(nt["search_queries"]), list(nt["uid"]) if "uid" in nt else None))
    return out


def repeated_query_shares(queries: list, groups: list | None = None) -> dict[str, list[float]]:
    """Of a step's searches, the share that repeats a query text sent before in the step
    (``repeated_query_share``), and the share that repeats one of the same question's samples
    (``repeated_query_share_in_question``; ``groups`` are the trajectories' uids). 0 without searches.
    What the retriever's result cache and batch sharing can save (retrieval/server.py)."""
    rows = [list(q or []) for q in queries]
    sent = [q for r in rows for q in r]
    by_question: dict = {}
    for g, r in zip(groups if groups is not None else range(len(rows)), rows):
        by_question.setdefault(g, []).extend(r)
    within = sum(len(v) - len(set(v)) for v in by_question.values())
    n = max(len(sent), 1)
    return {"search_r1/repeated_query_share": [(len(sent) - len(set(sent))) / n],
            "search_r1/repeated_query_share_in_question": [within / n]}


STOP_FLAG = ".stop_requested"  # in trainer.default_local_dir: the driver got SIGTERM with trainer.save_on_sigterm


class StopAfterSave(Exception):
    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


def stop_requested(root: str) -> bool:
    return os.path.exists(os.path.join(root, STOP_FLAG))


def make_trainer_class():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    class SearchR1Trainer(RayPPOTrainer):
        """verl's trainer; adds the agent statistics and the collapse alarm to each step's metrics."""

        def _update_actor_with_metrics(self, batch):
            from train.lld_alarm import AlarmConfig, CollapseMonitor
            from train.loss import finish_llds_metrics

            out = super()._update_actor(batch)
            metrics = out.meta_info.setdefault("metrics", {})
            finish_llds_metrics(metrics)
            metrics.update(search_metrics(batch))
            if not hasattr(self, "_collapse_monitor"):
                cfg = OmegaConf.to_container(self.config.get("lld_alarm") or {}, resolve=True)
                self._collapse_monitor = CollapseMonitor(AlarmConfig.from_dict(cfg))
            alarm, warnings = self._collapse_monitor.update(self.global_steps, metrics)
            for message in warnings:
                print(f"WARNING: {message}", flush=True)
            metrics.update({k: [v] for k, v in alarm.items()})
            return out

        def _update_actor(self, batch):
            out = self._update_actor_with_metrics(batch)
            if stop_requested(self.config.trainer.default_local_dir):  # SIGTERM with trainer.save_on_sigterm
                print(f"SIGTERM: step {self.global_steps} is trained; saving its checkpoint, then stopping after "
                      f"the step (trainer.save_on_sigterm)", flush=True)
                self._save_checkpoint()
            return out

        def _start_profiling(self, do_profile: bool) -> None:
            """Called by verl's loop at the start of every step, before its rollout: where a run asked to
            stop (SIGTERM with trainer.save_on_sigterm) ends, after the step before was saved and logged."""
            if stop_requested(self.config.trainer.default_local_dir):
                raise StopAfterSave(getattr(self, "_saved_step", None))
            return super()._start_profiling(do_profile)

        def fit(self):
            from train import metrics_file

            try:
                with metrics_file.appending():  # verl's file logger would truncate the run's metrics
                    return super().fit()
            except StopAfterSave as stop:
                print(f"stopped (SIGTERM) after saving global_step_{stop.step}" if stop.step else
                      "stopped (SIGTERM) before the first step", flush=True)
                if hasattr(self, "_shutdown_dump_executor"):
                    self._shutdown_dump_executor()

        def _save_checkpoint(self):
            """verl's save, then a manifest of the files (synced to disk) and the tracker written
            atomically, so that a resume only ever lands on a complete checkpoint; free space is checked
            first, and a failed save names the folder (and the free space when the disk is full)."""
            from train import checkpoints

            root, step = self.config.trainer.default_local_dir, self.global_steps
            if getattr(self, "_saved_step", None) == step:  # saved on SIGTERM already; verl's own save of the step
                return
            previous = [s for s in checkpoints.saved_steps(root) if s < step]
            checkpoints.check_free_space(root, step, previous[-1] if previous else None)
            try:
                super()._save_checkpoint()
            except Exception as e:
                raise checkpoints.CheckpointError(checkpoints.describe_save_failure(root, step, e)) from e
            ckpt = self.config.actor_rollout_ref.actor.get("checkpoint") or {}
            if not ckpt.get("async_save", False):  # async shards are still being written: verl skips the tracker too
                checkpoints.write_manifest(checkpoints.step_dir(root, step))
                checkpoints.write_tracker(root, step)
            self._saved_step = step
            keep_last, keep_steps = checkpoints.check_config(
                OmegaConf.to_container(self.config.get("checkpoints") or {}, resolve=True))
            removed = checkpoints.prune(root, keep_last, keep_steps)
            if removed:
                print(f"checkpoints: removed global_step_{removed} (checkpoints.keep_last={keep_last}, "
                      f"keep_steps={keep_steps})", flush=True)

        def _load_checkpoint(self):
            from train import checkpoints

            try:
                return super()._load_checkpoint()
            except Exception as e:
                root = self.config.trainer.default_local_dir
                step, why = checkpoints.read_tracker(root)
                where = checkpoints.step_dir(root, step) if step is not None else f"{root} ({why})"
                raise checkpoints.CheckpointError(
                    f"loading the checkpoint {where} failed: {type(e).__name__}: {str(e)[-2000:]}. Move that folder "
                    f"aside to resume from the one before (trainer.resume_mode=auto picks the newest complete one)"
                ) from e

    return SearchR1Trainer


def install_llds_loss(trainer, config: DictConfig) -> None:
    """Swap the actor's loss for verl's ppo_loss + LLDS (a no-op loss change when disabled)."""
    from verl.utils.config import omega_conf_to_dataclass

    from train.loss import LLDSConfig, make_actor_loss

    from train.agent_loop import SearchConfig

    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    search = SearchConfig.from_config(OmegaConf.to_container(config.get("search_r1") or {}, resolve=True))
    actor_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    positions = max(search.max_turns, search.val_max_turns) + 1  # generations per trajectory, at most
    trainer.actor_rollout_wg.set_loss_fn(make_actor_loss(actor_cfg, llds, positions=positions))


@ray.remote(num_cpus=1)
class SearchR1TaskRunner(BaseTaskRunner):
    def add_actor_rollout_worker(self, config):
        cls, group_cls = super().add_actor_rollout_worker(config)
        from train import cpu

        if cpu.enabled():  # CPU runs: the same verl workers, process group opened on gloo
            from train.cpu.worker import CPUActorRolloutRefWorker

            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(CPUActorRolloutRefWorker)
            cls = CPUActorRolloutRefWorker
        return cls, group_cls

    def add_critic_worker(self, config):
        """verl's critic worker, with the critic built with its configured attention
        (:mod:`train.value_model`; verl's loader forces flash_attention_2)."""
        super().add_critic_worker(config)
        from verl.trainer.ppo.ray_trainer import Role

        from train import cpu

        if cpu.enabled():
            from train.cpu.worker import CPUCriticWorker as worker
        else:
            from train.critic import CriticWorker as worker
        self.role_worker_mapping[Role.Critic] = ray.remote(worker)

    def run(self, config: DictConfig) -> None:
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        import train.plugin  # noqa: F401  (the agent loop registration, also in this actor)

        print(f"SearchR1TaskRunner on {socket.gethostname()} pid {os.getpid()}")
        OmegaConf.resolve(config)
        actor_rollout_cls, worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)

        model_config: HFModelConfig = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        train_ds = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor, is_train=True,
                                     max_samples=config.data.get("train_max_samples", -1))
        val_ds = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor, is_train=False,
                                   max_samples=config.data.get("val_max_samples", -1))
        trainer = make_trainer_class()(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config), ray_worker_group_cls=worker_group_cls,
            train_dataset=train_ds, val_dataset=val_ds, collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_ds),
        )
        trainer.init_workers()
        install_llds_loss(trainer, config)
        trainer.fit()


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
            raise SystemExit(f"error: the Ray cluster at {address} authenticates by token (Ray's default for "
                             f"`ray start`) and this process sent none: set RAY_AUTH_MODE=token (the token is read from "
                             f"~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH)") from None
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


@hydra.main(config_path=CONFIG_DIR, config_name="grpo_llds", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    from train import cpu, preflight

    plugins_env = "SEARCH_R1_PLUGINS"  # train.plugin imports these in every process; a bad one fails here
    if os.environ.get(plugins_env):  # files by absolute path: Ray workers may start elsewhere
        os.environ[plugins_env] = ",".join(os.path.abspath(p) if p.strip().endswith(".py") else p.strip()
                                           for p in os.environ[plugins_env].split(",") if p.strip())
    try:
        from train.plugin import import_user_plugins

        import_user_plugins()
    except Exception as e:
        raise SystemExit(f"error: {plugins_env}={os.environ.get(plugins_env)!r}: {type(e).__name__}: {e}") from None
    check_config(config)
    root = os.path.abspath(str(config.trainer.default_local_dir))
    stop_flag = os.path.join(root, STOP_FLAG)
    if os.path.exists(stop_flag):  # left by an earlier run's SIGTERM
        os.unlink(stop_flag)
    terminated = on_sigterm(config, root)  # before Ray, and again once ray.init has put its own in place
    try:
        prepare_run(config, root, plugins_env)
        if not ray.is_initialized():
            init_ray(config, cpu=cpu.enabled())
        try:
            preflight.ray_resources_preflight(config)
        except ValueError as e:
            ray.shutdown()
            raise SystemExit(f"error: {e}") from None
        on_sigterm(config, root, terminated)
        run_ppo(config, task_runner_class=SearchR1TaskRunner)
    except KeyboardInterrupt:
        if not terminated:
            raise
        stop_after_sigterm(root)
    if terminated:  # trainer.save_on_sigterm: the step finished and was saved
        stop_after_sigterm(root)


def prepare_run(config: DictConfig, root: str, plugins_env: str) -> int:
    """Everything before Ray starts: environment and data checks, where the run resumes (the newest
    complete checkpoint), the metrics file beside the checkpoints. Returns the step resumed from."""
    from train import checkpoints, cpu, metrics_file, preflight

    preflight.run_all(config, cpu=cpu.enabled())
    try:
        preflight.strategy_preflight(config, cpu=cpu.enabled())
        preflight.model_preflight(config)
        preflight.data_preflight(config)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    with open_dict(config):  # one resolved folder for the checks here and for verl's workers
        config.trainer.default_local_dir = root
    try:
        resume_step = checkpoints.prepare_resume(root, config.trainer.resume_mode,
                                                 config.trainer.get("resume_from_path"))
    except checkpoints.CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    metrics = metrics_file.path_for(config.trainer.get("logger"), root)
    if metrics:
        os.environ[metrics_file.ENV] = metrics
        metrics_file.keep_until(metrics, resume_step)
    # WANDB_MODE from the preflight; where verl's file logger writes (trainer.logger: [..., file])
    forward_env_to_ray(config, ("WANDB_MODE", "VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", plugins_env))
    return resume_step


def on_sigterm(config: DictConfig, root: str, got: list | None = None) -> list:
    """Handle SIGTERM in the driver (Ray's own handler exits 1, or aborts with 134 and a stack dump,
    where Slurm and Kubernetes expect 143): abandon the step, shut Ray down, exit 143. With
    ``+trainer.save_on_sigterm=true`` the step in progress finishes and is saved first (a second
    SIGTERM abandons it). Returns the list that records the signal."""
    import signal

    got = [] if got is None else got
    save = bool(config.trainer.get("save_on_sigterm", False))

    def handler(signum, frame):
        got.append(signum)
        if save and len(got) == 1:
            os.makedirs(root, exist_ok=True)
            open(os.path.join(root, STOP_FLAG), "w").close()
            print("SIGTERM: finishing this step and saving its checkpoint (trainer.save_on_sigterm=true), then "
                  "exiting 143; a second SIGTERM stops at once", flush=True)
            return
        raise KeyboardInterrupt  # what ray.get is interrupted by cleanly

    signal.signal(signal.SIGTERM, handler)
    return got


def stop_after_sigterm(root: str) -> None:
    from train import checkpoints

    step, _ = checkpoints.read_tracker(root)
    print("SIGTERM: stopped; the newest checkpoint is "
          + (f"global_step_{step} in {root}: rerun the same command to resume from it" if step else
             "none: rerun to start again"), flush=True)
    try:
        ray.shutdown()
    finally:
        raise SystemExit(143)

if __name__ == "__main__":
    main()
