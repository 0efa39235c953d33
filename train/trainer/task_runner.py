"""The Ray actor that runs training (verl's task runner, as ``run_ppo`` starts it): it swaps in
our workers where needed (CPU, the critic's attention), builds the datasets and
:class:`~train.trainer.ray_trainer.SearchR1Trainer`, starts the workers, installs the LLDS actor loss
with ``set_loss_fn`` and calls ``fit``."""

from __future__ import annotations

import os
import socket

import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner


def install_llds_loss(trainer, config: DictConfig) -> None:
    """Swap the actor's loss for verl's ppo_loss + LLDS and SAPO's drift penalty (each only when enabled;
    the diagnostics are logged either way)."""
    from verl.utils.config import omega_conf_to_dataclass

    from train.llds.drift import DriftConfig
    from train.llds.loss import LLDSConfig, make_actor_loss
    from train.search_r1.config import SearchConfig

    llds = LLDSConfig.from_dict(OmegaConf.to_container(config.get("llds") or {}, resolve=True))
    search = SearchConfig.of(config)
    actor_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    positions = max(search.max_turns, search.val_max_turns) + 1  # generations per trajectory, at most
    drift = DriftConfig.from_dict(OmegaConf.to_container(config.get("drift_penalty") or {}, resolve=True))
    trainer.actor_rollout_wg.set_loss_fn(make_actor_loss(actor_cfg, llds, positions=positions, drift_config=drift))


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
        (:mod:`train.workers.value_model`; verl's loader forces flash_attention_2)."""
        super().add_critic_worker(config)
        from verl.trainer.ppo.ray_trainer import Role

        from train import cpu

        if cpu.enabled():
            from train.cpu.worker import CPUCriticWorker as worker
        else:
            from train.workers.critic_worker import CriticWorker as worker
        self.role_worker_mapping[Role.Critic] = ray.remote(worker)

    def run(self, config: DictConfig) -> None:
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        import train.plugin  # noqa: F401  (the agent loop registration, also in this actor)
        from train.trainer.ray_trainer import SearchR1Trainer

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
        trainer = SearchR1Trainer(
            config=config, tokenizer=tokenizer, processor=processor, role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config), ray_worker_group_cls=worker_group_cls,
            train_dataset=train_ds, val_dataset=val_ds, collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_ds),
        )
        trainer.init_workers()
        install_llds_loss(trainer, config)
        trainer.fit()
