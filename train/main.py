"""Training entry point: verl 0.9.1's PPO/GRPO trainer with the Search-R1 agent loop and LLDS.

    python -m train.main --config-name grpo_llds data.train_files=... actor_rollout_ref.model.path=...

Reading order: :func:`main` validates our blocks and verl's config, then hands
:class:`SearchR1TaskRunner` to verl's ``run_ppo`` (which starts Ray). The runner builds verl's
``RayPPOTrainer`` exactly as verl's own task runner does, starts the workers, installs the
LLDS actor loss with ``set_loss_fn``, and calls ``fit``.
"""

from __future__ import annotations

import os
import socket

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.main_ppo_v0 import BaseTaskRunner

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def check_config(config: DictConfig) -> None:
    """Our blocks and verl's own validation; raises with the offending key."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from train.agent_loop import SearchConfig
    from train.loss import LLDSConfig

    SearchConfig.from_config(OmegaConf.to_container(config.get("search_r1") or {}, resolve=True))
    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    if config.trainer.get("use_v1", True):
        raise ValueError("trainer.use_v1 must be false: train.main drives verl's RayPPOTrainer")
    if llds.enable:
        n = config.actor_rollout_ref.rollout.n
        updates = config.data.train_batch_size // config.actor_rollout_ref.actor.ppo_mini_batch_size
        if updates * config.actor_rollout_ref.actor.ppo_epochs < 2:
            raise ValueError(
                f"llds.enable needs >= 2 optimizer updates per rollout batch (LLDS is zero in the first): "
                f"data.train_batch_size={config.data.train_batch_size} / actor.ppo_mini_batch_size="
                f"{config.actor_rollout_ref.actor.ppo_mini_batch_size} gives {updates} (rollout.n={n})")
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


def install_llds_loss(trainer, config: DictConfig) -> None:
    """Swap the actor's loss for verl's ppo_loss + LLDS (a no-op loss change when disabled)."""
    from verl.utils.config import omega_conf_to_dataclass

    from train.loss import LLDSConfig, make_actor_loss

    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    actor_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    trainer.actor_rollout_wg.set_loss_fn(make_actor_loss(actor_cfg, llds))


@ray.remote(num_cpus=1)
class SearchR1TaskRunner(BaseTaskRunner):
    def run(self, config: DictConfig) -> None:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
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
        trainer = RayPPOTrainer(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config), ray_worker_group_cls=worker_group_cls,
            train_dataset=train_ds, val_dataset=val_ds, collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_ds),
        )
        trainer.init_workers()
        install_llds_loss(trainer, config)
        trainer.fit()


@hydra.main(config_path=CONFIG_DIR, config_name="grpo_llds", version_base=None)
def main(config: DictConfig) -> None:
    from verl.trainer.main_ppo import run_ppo

    check_config(config)
    run_ppo(config, task_runner_class=SearchR1TaskRunner)


if __name__ == "__main__":
    main()
