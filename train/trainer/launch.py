"""A training run from its composed config, top to bottom: user plugins, the config checks, the
SIGTERM handler, the checks before Ray (environment, model, data, where the run resumes, the
metrics file), Ray, the resource check, then verl's ``run_ppo`` with our task runner
(:mod:`train.trainer.task_runner`). A problem found on the way is a :class:`~train.errors.UserError`
(``python -m train.main`` prints it as one line, exit 2). When the collapse warning stops the run
(``collapse_warning.action`` stop or rollback), :func:`roll_back` either exits 5 or resumes from the
checkpoint before the warning began with a smaller learning rate, in a fresh Ray (:mod:`train.trainer.rollback`)."""

from __future__ import annotations

import itertools
import os

import ray
from omegaconf import DictConfig, OmegaConf, open_dict

from train.errors import CollapseStopped, ConfigError, UserError


def launch(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    from train import PLUGINS_ENV, cpu
    from train.trainer import preflight
    from train.trainer.config_checks import check_config
    from train.trainer.probe import FILE as PROBE_FILE
    from train.trainer.ray_setup import init_ray
    from train.trainer.rollback import Stop
    from train.trainer.sigterm import COLLAPSE_FLAG, STOP_FLAG, on_sigterm, stop_after_sigterm
    from train.trainer.task_runner import SearchR1TaskRunner

    # train.plugin imports these in every process; a bad one fails here
    if os.environ.get(PLUGINS_ENV):  # files by absolute path: Ray workers may start elsewhere
        os.environ[PLUGINS_ENV] = ",".join(os.path.abspath(p) if p.strip().endswith(".py") else p.strip()
                                           for p in os.environ[PLUGINS_ENV].split(",") if p.strip())
    try:
        from train.plugin import import_user_plugins

        import_user_plugins()
    except Exception as e:
        raise ConfigError(f"{PLUGINS_ENV}={os.environ.get(PLUGINS_ENV)!r}: {type(e).__name__}: {e}") from None
    check_config(config)
    root = os.path.abspath(str(config.trainer.default_local_dir))
    for flag in (STOP_FLAG, COLLAPSE_FLAG):  # left by an earlier run's SIGTERM or collapse stop
        if os.path.exists(os.path.join(root, flag)):
            os.unlink(os.path.join(root, flag))
    terminated = on_sigterm(config, root)  # before Ray, and again once ray.init has put its own in place
    try:
        if not prepare_run(config, root) and os.path.exists(os.path.join(root, PROBE_FILE)):
            os.unlink(os.path.join(root, PROBE_FILE))  # from scratch: an earlier run's probe is not this run's
        if not ray.is_initialized():
            init_ray(config, cpu=cpu.enabled())
        try:
            preflight.ray_resources_preflight(config)
        except UserError:
            ray.shutdown()
            raise
        on_sigterm(config, root, terminated)
        for attempt in itertools.count(1):
            run_ppo(config, task_runner_class=SearchR1TaskRunner)
            stop = Stop.read(os.path.join(root, COLLAPSE_FLAG))
            if stop is None:  # the run reached its last step (or stopped on SIGTERM)
                break
            roll_back(config, root, stop, attempt)  # or CollapseStopped (exit 5)
            ray.shutdown()  # the run goes on from the checkpoint before the warning, in a fresh Ray
            prepare_run(config, root)
            init_ray(config, cpu=cpu.enabled())
            preflight.ray_resources_preflight(config)
            on_sigterm(config, root, terminated)
    except KeyboardInterrupt:
        if not terminated:
            raise
        stop_after_sigterm(root)
    if terminated:  # trainer.save_on_sigterm: the step finished and was saved
        stop_after_sigterm(root)


def roll_back(config: DictConfig, root: str, stop, attempt: int) -> None:
    """After the collapse warning stopped the run: with ``collapse_warning.action=rollback`` and rollbacks
    left, set the newer checkpoints and the metrics aside and point ``config`` at the checkpoint before the
    warning began, with the actor's learning rate scaled (:mod:`train.trainer.rollback`); otherwise raise
    :class:`~train.errors.CollapseStopped` with the trainer's text."""
    from train.monitor.detectors import WarningConfig
    from train.trainer import checkpoint_store, metrics_file
    from train.trainer.rollback import set_aside

    cfg = WarningConfig.from_dict(OmegaConf.to_container(config.get("collapse_warning") or {}, resolve=True))
    if cfg.action != "rollback":
        raise CollapseStopped(stop.text)
    if attempt > cfg.max_rollbacks:
        raise CollapseStopped(f"{stop.text}; after {attempt - 1} rollback(s) (collapse_warning.max_rollbacks="
                              f"{cfg.max_rollbacks})")
    actor = config.actor_rollout_ref.actor
    old_lr = float(actor.optim.lr)
    plan = set_aside(root, stop, attempt, metrics_file.path_for(config.trainer.get("logger"), root), old_lr,
                     cfg.rollback_lr_scale)
    with open_dict(config):
        actor.optim.lr = plan.lr
        actor.checkpoint.load_contents = ["model"]  # weights and data position; optimizer and schedule fresh
        if plan.target:
            config.trainer.resume_mode = "resume_path"
            config.trainer.resume_from_path = checkpoint_store.step_dir(root, plan.target)
        else:
            config.trainer.resume_mode = "disable"
    print(plan.describe(stop, old_lr, cfg.rollback_lr_scale, cfg.max_rollbacks), flush=True)


def prepare_run(config: DictConfig, root: str) -> int:
    """Everything before Ray starts: environment and data checks, where the run resumes (the newest
    complete checkpoint), the metrics file beside the checkpoints. Returns the step resumed from."""
    from train import PLUGINS_ENV, cpu
    from train.trainer import checkpoint_store, metrics_file, preflight
    from train.trainer.ray_setup import forward_env_to_ray

    preflight.run_all(config, cpu=cpu.enabled())
    preflight.strategy_preflight(config, cpu=cpu.enabled())
    preflight.model_preflight(config)
    preflight.data_preflight(config)
    with open_dict(config):  # one resolved folder for the checks here and for verl's workers
        config.trainer.default_local_dir = root
    resume_step = checkpoint_store.prepare_resume(root, config.trainer.resume_mode,
                                                  config.trainer.get("resume_from_path"))
    metrics = metrics_file.path_for(config.trainer.get("logger"), root)
    if metrics:
        os.environ[metrics_file.ENV] = metrics
        metrics_file.keep_until(metrics, resume_step)
    # WANDB_MODE from the preflight; where verl's file logger writes (trainer.logger: [..., file])
    forward_env_to_ray(config, ("WANDB_MODE", "VERL_FILE_LOGGER_PATH", "VERL_FILE_LOGGER_ROOT", PLUGINS_ENV))
    return resume_step
