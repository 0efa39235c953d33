"""python -m train.main --config-name PRESET [overrides]: train with verl 0.9.1's PPO/GRPO trainer,
the Search-R1 agent loop and LLDS.

    python -m train.main --config-name grpo_llds data.train_files=... actor_rollout_ref.model.path=...

Reading order: :func:`train.trainer.launch.launch` checks the config and the machine, starts Ray and
hands :class:`~train.trainer.task_runner.SearchR1TaskRunner` to verl's ``run_ppo``; the runner builds
:class:`~train.trainer.ray_trainer.SearchR1Trainer` (verl's ``RayPPOTrainer`` plus the agent
statistics, the collapse alarm and complete checkpoints), installs the LLDS actor loss
(:mod:`train.llds.loss`) with ``set_loss_fn`` and calls ``fit``. With ``VERL_PLATFORM=cpu`` the same
loop runs on CPU (:mod:`train.cpu`). The presets: ``configs/``.

Exit status: 0 done; 2 a config, data, checkpoint or environment problem (one line, before Ray when
it can be found there); 5 the collapse warning stopped the run (``collapse_warning.action`` stop, or
rollback with no rollback left); 143 stopped by SIGTERM (the newest complete checkpoint resumes).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from train import CONFIG_DIR  # noqa: F401  (re-exported: tests and tools import it from here)
from train.errors import UserError, message


@hydra.main(config_path=CONFIG_DIR, config_name="grpo_llds", version_base=None)
def main(config: DictConfig) -> None:
    from train.trainer.launch import launch

    try:
        launch(config)
    except UserError as e:
        print(f"error: {message(e)}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
