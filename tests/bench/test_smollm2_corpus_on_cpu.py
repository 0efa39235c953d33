"""bench/smollm2_corpus.py's variants: every arm x regime composes over the SmolLM2 preset and passes verl's
validation, with the arm's method and the regime's number of optimizer updates per rollout batch."""

import pytest
from hydra import compose, initialize_config_dir

from bench import smollm2_corpus
from train import CONFIG_DIR
from train.trainer.config_checks import check_config

#: regime suffix -> (optimizer updates per rollout batch: (questions / mini-batch) x passes, learning rate)
REGIME = {"": (2, 5.0e-6), "_lrx10_updates4": (4, 5.0e-5)}


@pytest.mark.parametrize("variant", sorted(smollm2_corpus.variants()))
def test_every_variant_composes_with_its_method_and_updates(variant, tiny_model_dir):
    overrides = smollm2_corpus.variants()[variant]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=smollm2_corpus.PRESET,
                      overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}", *overrides])
    check_config(cfg)
    arm, _, rest = variant.partition("_")
    actor = cfg.actor_rollout_ref.actor
    updates = cfg.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs
    assert (updates, actor.optim.lr) == REGIME["_" + rest if rest else ""]
    assert cfg.llds.enable == (arm in ("llds", "lldsma"))
    assert cfg.drift_penalty.enable == (arm == "drift")
    assert (cfg.llds.get("answer_weight") == "adaptive") == (arm == "lldsma")
    assert (cfg.actor_rollout_ref.rollout.n, cfg.data.train_batch_size) == (4, 4)  # the preset's sizes, every arm
