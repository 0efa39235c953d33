"""The launchers' CPU rehearsal (REHEARSAL=cpu), the PPO critic with the configured attention, and
`scripts/train_ppo.sh` as typed training on CPU: critic, GAE, value loss, KL in the reward, 2 ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from train import CONFIG_DIR, rehearsal, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def composed(name, overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return flat(OmegaConf.to_container(compose(config_name=name, overrides=overrides), resolve=True))


@pytest.mark.parametrize("preset", settings.PRESETS)
def test_rehearsal_changes_only_the_documented_keys(preset):
    base = ["actor_rollout_ref.model.path=/m"]
    shipped = composed(preset, base)
    rehearsed = composed(preset, base + rehearsal.overrides(preset).copy() + ["+rehearsal=cpu"])
    changed = sorted(k for k in set(shipped) | set(rehearsed) if shipped.get(k) != rehearsed.get(k))
    undocumented = [f"{k}: {shipped.get(k)!r} -> {rehearsed.get(k)!r}" for k in changed
                    if not rehearsal.is_documented(k)]
    assert not undocumented, ("the rehearsal changes settings train/rehearsal.py does not list:\n"
                              + "\n".join(undocumented))
    # what must stay the preset's
    for key in ("actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.top_p",
                "actor_rollout_ref.actor.clip_ratio_c",
                "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.use_dynamic_bsz", "search_r1.max_turns",
                "llds.enable", "trainer.test_freq", "trainer.save_freq", "trainer.logger", "algorithm.adv_estimator"):
        assert shipped.get(key) == rehearsed.get(key), key
    # the preset's FSDP2 (configs/_base.yaml), not one the rehearsal forces: CI trains, saves and merges
    # checkpoints through the engine a GPU run uses
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.actor.fsdp_config.strategy",
                "actor_rollout_ref.ref.strategy", "actor_rollout_ref.ref.fsdp_config.strategy", "critic.strategy",
                "critic.fsdp.strategy"):
        assert shipped[key] == rehearsed[key] == "fsdp2", key
    updates = lambda c: c["data.train_batch_size"] // c["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert updates(rehearsed) == updates(shipped)


def test_rehearsal_batch_sizes():
    assert rehearsal.batch_sizes(520, 52, 5, ranks=2) == (20, 2)   # 10 updates of 2 prompts x 5 = 10 trajectories
    assert rehearsal.batch_sizes(512, 256, 1, ranks=2) == (4, 2)   # ppo: 2 updates
    with pytest.raises(ValueError, match="not a multiple"):
        rehearsal.batch_sizes(10, 3, 5)
    with pytest.raises(ValueError, match=">= 1"):
        rehearsal.batch_sizes(520, 52, 5, ranks=0)
    r = subprocess.run([sys.executable, "-m", "train.rehearsal", "no_such_preset"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "no_such_preset" in r.stderr
    for bad in (["--nodes", "0"], ["--ranks", "3", "--nodes", "2"]):  # one agent worker per node, ranks split
        r = subprocess.run([sys.executable, "-m", "train.rehearsal", "grpo", *bad], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and "--nodes must be >= 1 and divide --ranks" in r.stderr, r.stderr
    assert rehearsal.overrides("grpo", ranks=2, nodes=2)[-1] == "actor_rollout_ref.rollout.agent.num_workers=2"
    r = subprocess.run(["bash", "scripts/train_llds.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "REHEARSAL": "gpu", "PYTHON": sys.executable})
    assert r.returncode == 2 and "only rehearsal is REHEARSAL=cpu" in r.stderr


def test_critic_honours_the_configured_attention(tiny_model_dir):
    """verl's loader forces flash_attention_2 (not installed: it fails as 'install trl'); ours builds the
    token-classification critic with the config's SDPA, and verl's engine lookup finds it on NVIDIA GPUs."""
    from transformers import AutoConfig
    from verl.utils.model import load_valuehead_model
    from verl.workers.engine.base import EngineRegistry

    from train.workers import value_model

    cfg = AutoConfig.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    cfg.num_labels = 1
    with pytest.raises(RuntimeError, match="install trl"):
        load_valuehead_model(tiny_model_dir, "float32", cfg, False)
    model = value_model.load_value_model(tiny_model_dir, "float32", cfg, False)
    assert type(model).__name__ == "Qwen2ForTokenClassification" and model.config._attn_implementation == "sdpa"
    assert model.score.out_features == 1
    value_model.register()
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["value_model"][backend][("cuda", "nvidia")] is value_model.ValueHeadEngine
    with value_model.configured_value_loader():
        import verl.utils.model as m

        assert m.load_valuehead_model is value_model.load_value_model
    assert m.load_valuehead_model is load_valuehead_model


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, tiny_model_dir, bm25_server, qa_path):
    from train.data_prep import main as prep

    work = tmp_path_factory.mktemp("ppo")
    prep(["--out", str(work / "data"), "--local", str(qa_path), "--holdout", "5"])
    env = {**os.environ, "REHEARSAL": "cpu", "MODEL": str(tiny_model_dir), "DATA_DIR": str(work / "data"),
           "RETRIEVER_URL": f"{bm25_server.url}/retrieve", "PYTHON": sys.executable, "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
    log = work / "train_ppo.log"
    with open(log, "w") as f:
        r = subprocess.run(["bash", "scripts/train_ppo.sh", "trainer.total_training_steps=2",
                            f"trainer.default_local_dir={work / 'ckpt'}"], cwd=ROOT, env=env, stdout=f,
                           stderr=subprocess.STDOUT, timeout=900)
    assert r.returncode == 0, log.read_text()[-6000:]
    return work, log


@pytest.mark.slow
def test_train_ppo_sh_trains_the_critic_on_two_ranks(ppo_run):
    from step_metrics import parse

    work, log = ppo_run
    text = log.read_text()
    assert "rehearsal (cpu): ppo with" in text and "data.train_batch_size=4" in text
    steps = parse(log)
    assert sorted(steps) == [0, 1, 2]  # step 0: the preset's validation before training
    assert "val-core/nq/reward/mean@1" in steps[0]
    for n, m in ((n, steps[n]) for n in (1, 2)):
        for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean", "critic/advantages/max",
                    "critic/returns/mean", "timing_s/values", "timing_s/update_critic", "actor/reward_kl_penalty",
                    "actor/pg_loss"):
            assert key in m, (n, key)
        assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.001)
        assert m["critic/grad_norm"] > 0
    # after step 1's updates the actor differs from the reference: the KL penalty enters the reward
    assert steps[2]["actor/reward_kl_penalty"] != 0
    # both ranks hold a shard of the critic (and of the actor) in the final checkpoint
    critic = work / "ckpt" / "global_step_2" / "critic"
    assert {p.name for p in critic.glob("model_world_size_2_rank_*.pt")} == {f"model_world_size_2_rank_{r}.pt"
                                                                            for r in (0, 1)}
