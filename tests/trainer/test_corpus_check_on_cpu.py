"""What the trainer refuses before Ray starts that it found only in a worker, or
never. A paper preset against the bundled 5,148-passage sample (what `bash retrieval_launch.sh` serves by
default) is refused with the setting that accepts it deliberately; a misspelt reward metric or reward
setting is refused naming its key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from train import CONFIG_DIR
from train.errors import ConfigError
from train.trainer import corpus_check

ROOT = Path(__file__).resolve().parents[2]


def load(name, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_expectations_parse():
    assert corpus_check.parse("wiki18", "k") == ("passages", 21_015_324)
    assert corpus_check.parse("sample", "k") == ("passages", 5_148)
    assert corpus_check.parse("21,015,324", "k") == ("passages", 21_015_324)
    assert corpus_check.parse(300, "k") == ("passages", 300)
    assert corpus_check.parse("0123456789abcdef", "k") == ("index_id", "0123456789abcdef")
    for nothing in (None, "any", "ANY", ""):
        assert corpus_check.parse(nothing, "k") is None
    with pytest.raises(ConfigError, match="search_r1.expect_corpus: expected a corpus name .*got 'wiki'"):
        corpus_check.parse("wiki", "search_r1.expect_corpus")


def test_the_presets_expect_their_corpus():
    """The paper's presets expect wiki-18; the CPU presets (and so the launchers' rehearsal) check nothing;
    SmolLM2's expect the bundled sample its retriever serves."""
    for preset in ("grpo", "grpo_llds", "grpo_llds_r", "grpo_llds_ma", "grpo_drift", "gspo_llds", "ppo"):
        assert load(preset).search_r1.expect_corpus == "wiki18", preset
    for preset in ("cpu_smoke", "cpu_learn"):
        assert load(preset).search_r1.expect_corpus == "any", preset
    for preset in ("smollm2_grpo", "smollm2_grpo_llds", "smollm2_grpo_drift"):
        assert load(preset).search_r1.expect_corpus == "sample", preset
    assert load("grpo_llds", ["+rehearsal=cpu"]).search_r1.expect_corpus == "any"


def test_the_check_against_a_live_retriever(bm25_server):
    url = bm25_server.url + "/retrieve"
    with pytest.raises(ConfigError) as e:
        corpus_check.check("wiki18", url, "search_r1.expect_corpus=wiki18", "search_r1.expect_corpus=any")
    text = str(e.value)
    assert "serves 5,148 passages (the sample corpus)" in text and "not wiki18 (21,015,324 passages)" in text
    assert text.endswith("or set search_r1.expect_corpus=any to use this one deliberately"), text
    info = corpus_check.check("sample", url, "k", "o")
    assert info["passages"] == 5148
    assert corpus_check.check(info["index_id"], url, "k", "o")["index_id"] == info["index_id"]
    with pytest.raises(ConfigError, match="not index_id 0000000000000000"):
        corpus_check.check("0000000000000000", url, "k", "o")
    assert corpus_check.check("any", url, "k", "o") is None
    # nothing answers: not checked here (the launchers refuse a retriever that is down), said once
    from tests.conftest import free_port

    said = []
    assert corpus_check.check("wiki18", f"http://127.0.0.1:{free_port()}", "k", "o", log=said.append) is None
    assert len(said) == 1 and "is not checked" in said[0]


def test_a_paper_preset_against_the_sample_stops_before_ray(bm25_server, tmp_path):
    """`bash retrieval_launch.sh &` then `scripts/train_llds.sh` with no RETRIEVER: the paper's preset against
    the bundled sample. train.main refuses it in seconds, exit 2, naming the override; Ray never starts."""
    r = subprocess.run([sys.executable, "-m", "train.main", "--config-name", "grpo_llds",
                        f"search_r1.retriever_url={bm25_server.url}/retrieve",
                        f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
                       cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "search_r1.expect_corpus=wiki18: the retriever at" in error[0], r.stderr[-3000:]
    assert "5,148 passages" in error[0] and "set search_r1.expect_corpus=any" in error[0]
    assert "ray: starting" not in r.stdout and "ray: joining" not in r.stdout
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("override, named", [
    ("+reward.custom_reward_function.reward_kwargs.metric=exact_match",
     "reward.custom_reward_function.reward_kwargs.metric='exact_match': the reward's metric is one of em, sub_em, f1"),
    ("+reward.custom_reward_function.reward_kwargs.metrc=f1",
     "reward.custom_reward_function.reward_kwargs.metrc: not a setting of pkg://train.search_r1.reward:compute_score"),
    ("+reward.custom_reward_function.reward_kwargs.format_score=maybe",
     "reward.custom_reward_function.reward_kwargs.format_score must be true or false"),
    ("+llds.lamda=0.3", "unknown llds config keys: ['lamda']"),
    ("+collapse_warning.falling=3", "collapse_warning: unknown keys ['falling']"),
    ("collapse_warning.action=abort", "collapse_warning.action must be one of warn, stop, rollback"),
    ("+collapse_warning.levels.probe=[0.5,0.1]", "signal probe: watch 0.5 must be <= alarm 0.1"),
    ("+lld_alarm.enable=true", "lld_alarm: replaced by collapse_warning"),
    ("checkpoints.keep_last=-x", "checkpoints.keep_last"),
    ("search_r1.expect_corpus=wiki", "search_r1.expect_corpus: expected a corpus name"),
])
def test_a_misspelt_key_is_refused_before_ray(monkeypatch, override, named):
    """Each key our code reads is checked in train.main before Ray starts (a ConfigError: one line, exit 2),
    not in a reward or training worker minutes later."""
    from train.trainer import launch as launch_module
    from train.trainer import ray_setup

    started = []
    monkeypatch.setattr(ray_setup, "init_ray", lambda *a, **k: started.append(1))
    monkeypatch.setattr(launch_module, "prepare_run", lambda *a, **k: started.append(0))
    with pytest.raises(ConfigError) as e:
        launch_module.launch(load("grpo_llds", [override]))
    assert named in str(e.value) and not started


def test_good_reward_settings_and_a_users_reward_function(tmp_path):
    from train.trainer.config_checks import check_reward

    check_reward(load("grpo", ["+reward.custom_reward_function.reward_kwargs.metric=f1",
                               "+reward.custom_reward_function.reward_kwargs.format_score=true",
                               "+reward.custom_reward_function.reward_kwargs.retrieval_score=0.1"]))
    mine = tmp_path / "mine.py"
    mine.write_text("def score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n    return 0.0\n")
    path = [f"reward.custom_reward_function.path={mine}", "reward.custom_reward_function.name=score"]
    check_reward(load("grpo", [*path, "+reward.custom_reward_function.reward_kwargs.bonus=1"]))
    with pytest.raises(ConfigError, match=r"reward_kwargs.bonsu: .*mine.py:score has no parameter 'bonsu'"):
        check_reward(load("grpo", [*path, "+reward.custom_reward_function.reward_kwargs.bonsu=1"]))
