"""The presets against the settings table of docs/settings.md (train/settings.py), the released runs' batch
geometry, dual-clip off through verl's own policy loss, and the per-model reproduction table."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from train import CONFIG_DIR, settings
from train.trainer.config_checks import check_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def presets(tiny_model_dir):
    out = {}
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for name in settings.PRESETS:
            out[name] = compose(config_name=name, overrides=[f"actor_rollout_ref.model.path={tiny_model_dir}"])
    return out


def test_every_preset_matches_the_settings_table(presets):
    wrong = []
    for row in settings.ROWS:
        if row.key is None:
            continue
        for name, cfg in presets.items():
            got, want = settings.value(cfg, row.key), row.expected(name)
            same = got == pytest.approx(want) if isinstance(want, float) and got is not None else got == want
            if not same:
                wrong.append(f"{name}: {row.setting} ({row.key}) is {got!r}, the table says {want!r}")
    assert not wrong, "\n".join(wrong)


def test_every_preset_validates(presets):
    for cfg in presets.values():
        check_config(cfg)


def test_readme_holds_the_table():
    assert settings.markdown() in (ROOT / "docs" / "settings.md").read_text(), \
        "docs/settings.md's settings table is stale: paste `python -m train.settings` into docs/settings.md"


def test_table_covers_the_released_settings():
    keys = {r.key for r in settings.ROWS}
    for key in ("actor_rollout_ref.actor.clip_ratio_c", "actor_rollout_ref.rollout.top_p", "updates",
                "search_r1.max_turns", "search_r1.topk", "search_r1.val_max_turns", "llds.lambda",
                "actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.model.override_config.attn_implementation"):
        assert key in keys


# dual-clip -----------------------------------------------------------------------------------------

def _policy_grad(actor_cfg, ratio: float, adv: float):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    old = torch.zeros(1, 1)
    logp = torch.tensor([[float(torch.log(torch.tensor(ratio)))]], requires_grad=True)
    fn = get_policy_loss_fn(actor_cfg.policy_loss.get("loss_mode", "vanilla"))
    loss, _ = fn(old_log_prob=old, log_prob=logp, advantages=torch.tensor([[adv]]),
                 response_mask=torch.ones(1, 1, dtype=torch.bool), loss_agg_mode="token-mean", config=actor_cfg)
    loss.backward()
    return float(logp.grad)


def test_dual_clip_is_off_so_negative_advantage_gradients_match_the_released_loss(presets):
    """A < 0, ratio 5: the released PPO loss max(-A r, -A clip(r)) = -A r has gradient -A r w.r.t.
    log pi; verl's default dual-clip (3.0) replaces it by the constant -3 A: gradient 0."""
    from verl.utils.config import omega_conf_to_dataclass

    for name in ("grpo", "grpo_llds", "ppo"):
        actor = omega_conf_to_dataclass(presets[name].actor_rollout_ref.actor)
        assert _policy_grad(actor, 5.0, -1.0) == pytest.approx(5.0, rel=1e-5), name
    cfg = presets["grpo"].copy()
    cfg.actor_rollout_ref.actor.clip_ratio_c = 3.0  # verl's default
    assert _policy_grad(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor), 5.0, -1.0) == 0.0


# batch geometry --------------------------------------------------------------------------------------

def test_ten_updates_per_rollout_batch_on_4_and_8_gpus(presets):
    from train.trainer.batch_geometry import check_split, ten_update_geometry

    assert ten_update_geometry(4) == (520, 52) and ten_update_geometry(8) == (480, 48)
    assert ten_update_geometry(2) == (520, 52) and ten_update_geometry(32) == (640, 64)
    for ranks in (1, 2, 4, 8, 16, 32):
        train, mini = ten_update_geometry(ranks)
        assert train // mini == 10 and (mini * 5) % ranks == 0
        check_split(train, mini, 5, ranks)
    with pytest.raises(ValueError,
                       match=r"260 trajectories do not split over 8 ranks; e\.g\. data\.train_batch_size=480"):
        check_split(520, 52, 5, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        check_split(512, 52, 5, 4)
    with pytest.raises(ValueError, match="micro_batch_size_per_gpu=8 does not divide the 65"):
        check_split(520, 52, 5, 4, micro=8, dynamic=False)
    check_split(520, 52, 5, 4, micro=8, dynamic=True)  # token-packed micro-batches: no constraint
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        bad = compose(config_name="grpo_llds", overrides=["trainer.n_gpus_per_node=8"])
    with pytest.raises(ValueError, match="do not split over 8 ranks"):
        check_config(bad)


def test_launcher_picks_the_geometry_for_8_gpus(tmp_path):
    """scripts/_common.sh's geometry(): nothing on 4 GPUs, 480 / 48 on 8, nothing for ppo."""
    out = {}
    for gpus, preset in ((4, "grpo_llds"), (8, "grpo_llds"), (8, "ppo")):
        r = subprocess.run(["bash", "-c", f"source scripts/_common.sh; geometry {preset}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": sys.executable, "N_GPUS": str(gpus)})
        assert r.returncode == 0, r.stderr
        out[(gpus, preset)] = r.stdout.strip()
    assert out[(4, "grpo_llds")] == "" and out[(8, "ppo")] == ""
    assert out[(8, "grpo_llds")] == "data.train_batch_size=480 actor_rollout_ref.actor.ppo_mini_batch_size=48"


# per-model reproduction --------------------------------------------------------------------------------

def test_paper_runs_table():
    from train.paper_runs import lookup

    assert lookup("Qwen/Qwen2.5-7B-Instruct", "grpo_llds") == {"row": "7B-Ins GRPO+LLDS", "step": 650, "lambda": 0.3}
    assert lookup("Qwen/Qwen2.5-3B-Instruct", "grpo_llds") == {"row": "3B-Ins GRPO+LLDS", "step": 650, "lambda": 0.2}
    assert lookup("Qwen/Qwen2.5-3B", "grpo_llds") == {"row": "3B-Base GRPO+LLDS", "step": 600, "lambda": 0.2}
    assert lookup("Qwen/Qwen2.5-7B", "grpo_llds") == {"row": "7B-Base GRPO+LLDS", "step": 450, "lambda": 0.2}
    assert lookup("Qwen/Qwen2.5-3B", "grpo_llds_ma")["row"] == "3B-Base GRPO+LLDS-MA"
    assert lookup("/models/Qwen2.5-3B-Instruct", "gspo_llds")["row"] == "3B-Ins GSPO+LLDS"  # a local copy
    assert lookup("Qwen/Qwen2.5-3B", "ppo") == {"row": "3B-Base PPO", "step": None, "lambda": None}
    with pytest.raises(ValueError, match="no row '7B-Base GRPO\\+LLDS-MA'"):
        lookup("Qwen/Qwen2.5-7B", "grpo_llds_ma")
    with pytest.raises(ValueError, match="no paper run for model"):
        lookup("meta-llama/Llama-3.2-3B", "grpo_llds")


def test_reproduce_script_takes_step_and_lambda_from_the_table():
    # a baseline row has no fixed step: the run goes for the best checkpoint (here it stops at the data
    # download, offline, after saying so)
    env = {**os.environ, "PYTHON": sys.executable, "MODEL": "Qwen/Qwen2.5-3B", "PRESET": "grpo",
           "HF_HUB_OFFLINE": "1", "DATA_DIR": "/nonexistent/data"}
    r = subprocess.run(["bash", "scripts/reproduce_paper.sh"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=env)
    assert "reproducing '3B-Base GRPO': Qwen/Qwen2.5-3B, preset grpo, the best checkpoint before collapse" in r.stdout
    r = subprocess.run(["bash", "scripts/reproduce_paper.sh"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**env, "PRESET": "grpo_llds"})
    assert "reproducing '3B-Base GRPO+LLDS': Qwen/Qwen2.5-3B, preset grpo_llds, evaluated at step 600, lambda 0.2" \
        in r.stdout
    text = (ROOT / "scripts/reproduce_paper.sh").read_text()
    assert 'EXTRA+=("llds.lambda=$LAMBDA")' in text and '--paper-row "$PAPER_ROW"' in text


# keys verl never reads ------------------------------------------------------------------------------

def _verl_reads(leaf: str, source: str) -> bool:
    return re.search(rf"\.{re.escape(leaf)}\b|[\"']{re.escape(leaf)}[\"']", source) is not None


@pytest.fixture(scope="module")
def verl_source() -> str:
    """verl's code, without its config schemas (a field declared there is not a field read)."""
    import verl

    root = Path(verl.__file__).parent
    return "\n".join(p.read_text(errors="ignore") for p in root.rglob("*.py")
                     if not p.relative_to(root).as_posix().startswith(("workers/config/", "trainer/config/")))


def _set_keys(path: Path):
    """Every leaf key a config file of ours sets (our own blocks are validated by our own code)."""
    from omegaconf import OmegaConf

    from train.trainer.config_checks import OUR_BLOCKS

    ours = {*OUR_BLOCKS, "hydra", "defaults"}

    def walk(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and v and k != "mixed_precision":
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    return [k for k in walk(OmegaConf.to_container(OmegaConf.load(path))) if k.split(".")[0] not in ours]


def test_every_key_our_configs_set_is_read_by_verl(verl_source):
    """A key verl's engine path never reads is silently ignored (actor.grad_clip was: the FSDP engine reads
    actor.optim.clip_grad). Each leaf our configs set must be read somewhere in verl's code (attribute or
    string key) outside the config schemas; ray_kwargs.ray_init.* must be ray.init() arguments."""
    import inspect

    import ray

    init_args = set(inspect.signature(ray.init).parameters)
    ignored = []
    presets = sorted((ROOT / "configs").rglob("*.yaml"))
    assert len(presets) >= 10, presets  # the presets' folder moved once and this loop saw none
    for path in presets:
        for key in _set_keys(path):
            leaf = key.split(".")[-1]
            if key.startswith("ray_kwargs.ray_init."):
                if leaf not in init_args:
                    ignored.append(f"{path.name}: {key} is not a ray.init() argument")
            elif not _verl_reads(leaf, verl_source):
                ignored.append(f"{path.name}: {key} (no verl code reads '{leaf}')")
    assert not ignored, "settings verl ignores:\n" + "\n".join(ignored)


def test_the_key_check_catches_grad_clip(verl_source):
    assert not _verl_reads("grad_clip", verl_source)
    assert _verl_reads("clip_grad", verl_source) and _verl_reads("mixed_precision", verl_source)
