"""Every preset composes over verl's ppo_trainer and passes verl's own config validation."""


import pytest
from hydra import compose, initialize_config_dir

from train import CONFIG_DIR
from train.settings import PRESETS
from train.trainer.config_checks import check_config

MODEL = {}


@pytest.fixture(autouse=True)
def _offline_model(tiny_model_dir):
    MODEL["path"] = str(tiny_model_dir)  # verl's validation loads the tokenizer: no hub download


def load(name, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=[f"actor_rollout_ref.model.path={MODEL['path']}", *overrides])


@pytest.mark.parametrize("name", PRESETS)
def test_preset_composes_and_validates(name):
    cfg = load(name)
    check_config(cfg)
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "search_r1"
    assert cfg.reward.custom_reward_function.path == "pkg://train.search_r1.reward"
    assert cfg.search_r1.topk == 3 and cfg.search_r1.val_max_turns == 4
    assert cfg.search_r1.max_turns == (4 if name == "ppo" else 3)
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6 and cfg.trainer.total_training_steps == 1005
    updates = cfg.data.train_batch_size // cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert updates == (2 if name == "ppo" else 10)


def test_preset_values():
    assert load("grpo").llds.enable is False
    c = load("grpo_llds")
    assert (c.llds.enable, c.llds["lambda"], c.llds.gate) == (True, 0.2, "action")
    assert load("grpo_llds_r").llds.gate == "response"
    assert load("grpo_llds_ma").llds.answer_weight == "adaptive"
    p = load("ppo")
    assert p.algorithm.adv_estimator == "gae" and p.actor_rollout_ref.rollout.n == 1
    g = load("gspo_llds")
    assert g.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo" and g.llds.gate == "action"


def test_smollm2_presets_differ_only_in_the_method():
    """The three SmolLM2 presets run the same questions, model, sizes and seeds; the method (LLDS, SAPO's
    drift penalty) is the one difference."""
    from omegaconf import OmegaConf

    a, b, c = (OmegaConf.to_container(load(n), resolve=True)
               for n in ("smollm2_grpo", "smollm2_grpo_llds", "smollm2_grpo_drift"))
    assert (a["llds"]["enable"], b["llds"]["enable"], c["llds"]["enable"]) == (False, True, False)
    assert b["llds"]["lambda"] == 0.2
    assert (a["drift_penalty"]["enable"], b["drift_penalty"]["enable"], c["drift_penalty"]["enable"]) == \
        (False, False, True)
    for x in (a, b, c):
        x.pop("llds"), x.pop("drift_penalty")
        x["trainer"].pop("experiment_name"), x["trainer"].pop("default_local_dir")
        x["actor_rollout_ref"]["rollout"]["trace"].pop("experiment_name")
    assert a == b == c
    check_config(load("smollm2_grpo_llds"))
    check_config(load("smollm2_grpo_drift"))
    assert load("smollm2_grpo").data.train_files.endswith("train.parquet")


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="llds.gate"):
        check_config(load("grpo_llds", ["llds.gate=chunk"]))
    with pytest.raises(ValueError, match=">= 2 optimizer updates"):
        check_config(load("grpo_llds", ["actor_rollout_ref.actor.ppo_mini_batch_size=520"]))
    with pytest.raises(ValueError, match="unknown search_r1"):
        check_config(load("grpo", ["+search_r1.top_k=3"]))
    with pytest.raises(ValueError, match="use_v1"):
        check_config(load("grpo", ["trainer.use_v1=true"]))
    with pytest.raises(ValueError, match="algorithm.filter_groups.enable=true has no effect"):
        check_config(load("grpo", ["algorithm.filter_groups.enable=true"]))
    with pytest.raises(ValueError, match="drift_penalty.enable needs >= 2 optimizer updates"):
        check_config(load("grpo_drift", ["actor_rollout_ref.actor.ppo_mini_batch_size=520"]))
    with pytest.raises(ValueError, match="drift_penalty.threshold"):
        check_config(load("grpo_drift", ["drift_penalty.threshold=0"]))
    with pytest.raises(ValueError, match="flat_steps: the one key is skip_update, true or false"):
        check_config(load("grpo", ["flat_steps.skip_update=maybe"]))
    with pytest.raises(ValueError, match="flat_steps: the one key is skip_update"):
        check_config(load("grpo", ["+flat_steps.skip_updates=true"]))
    check_config(load("grpo", ["flat_steps.skip_update=true"]))


CPU_PRESETS = ["cpu_smoke", "cpu_learn", "smollm2_grpo", "smollm2_grpo_llds", "smollm2_grpo_drift"]


@pytest.mark.parametrize("name,dtype", [*[(p, "bf16") for p in PRESETS], *[(p, "fp32") for p in CPU_PRESETS]])
def test_compute_precision_is_explicit_and_shared_by_actor_and_ref(name, dtype):
    """verl's FSDP engine reads only fsdp_config.mixed_precision (unset: bf16 autocast); the actor and
    the reference model compute the KL between them, so they compute in the same precision."""
    a = load(name).actor_rollout_ref
    want = {"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert dict(a.actor.fsdp_config.mixed_precision) == want
    assert dict(a.ref.fsdp_config.mixed_precision) == want


@pytest.mark.parametrize("name", [*PRESETS, *CPU_PRESETS])
def test_fsdp2_for_actor_ref_and_critic_on_every_platform(name):
    """FSDP2 everywhere (configs/_base.yaml): verl's default FSDP1 cannot run on CPU, so a GPU run on
    FSDP1 would train and checkpoint through code CI never runs. The strategy reaches the engine config
    verl's workers pick the engine by (EngineRegistry.new(backend=engine_config.strategy))."""
    from omegaconf import open_dict
    from verl.utils.config import omega_conf_to_dataclass

    from train.trainer import preflight

    cfg = load(name)
    a = cfg.actor_rollout_ref
    strategies = {"actor": a.actor.strategy, "actor.fsdp_config": a.actor.fsdp_config.strategy,
                  "ref": a.ref.strategy, "ref.fsdp_config": a.ref.fsdp_config.strategy,
                  "critic": cfg.critic.strategy, "critic.fsdp": cfg.critic.fsdp.strategy}
    assert set(strategies.values()) == {"fsdp2"}, strategies
    assert omega_conf_to_dataclass(a.actor).engine.strategy == "fsdp2"
    with open_dict(a.ref):  # what verl's ActorRolloutRefWorker does to the ref block before it converts it
        a.ref.ppo_mini_batch_size = a.actor.ppo_mini_batch_size
        a.ref.ppo_micro_batch_size = a.ref.pop("log_prob_micro_batch_size", None)
        a.ref.ppo_micro_batch_size_per_gpu = a.ref.pop("log_prob_micro_batch_size_per_gpu", None)
        a.ref.use_dynamic_bsz = a.ref.pop("log_prob_use_dynamic_bsz", False)
        a.ref.ppo_max_token_len_per_gpu = a.ref.pop("log_prob_max_token_len_per_gpu", None)
    ref = omega_conf_to_dataclass(a.ref)
    assert ref.engine.strategy == "fsdp2" and ref.engine.forward_only
    if name == "ppo":  # the other presets never build the critic (its model path is verl's placeholder)
        assert omega_conf_to_dataclass(cfg.critic).engine.strategy == "fsdp2"
    preflight.strategy_preflight(cfg, cpu=True)  # runs on CPU as shipped: no FSDP1 anywhere
