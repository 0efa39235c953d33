"""The learnable task's data, tokenizer and warm-start trajectories (the fast parts; the training
run that learns on it is tests/toy/test_learning_on_cpu.py)."""

import json
from collections import Counter

import pytest

from train import learnable as learnable_cmd
from train.search_r1 import protocol
from train.toy import learnable_task as learnable


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return learnable.write_task(tmp_path_factory.mktemp("facts"), 300, seed=0)


def records(path):
    return [json.loads(line) for line in open(path)]


def test_task_is_deterministic_and_every_name_distinct(task, tmp_path):
    corpus, qa = task
    again = learnable.write_task(tmp_path, 300, seed=0)
    assert corpus.read_text() == again[0].read_text() and qa.read_text() == again[1].read_text()
    facts = learnable.make_facts(300, 0)
    names = [f[k] for f in facts for k in ("country", "capital", "city")]
    assert len(set(names)) == 900
    rows = records(qa)
    assert rows[0]["question"] == f"What is the capital of {facts[0]['country']}?"
    assert rows[0]["golden_answers"] == [facts[0]["capital"]] and rows[0]["metadata"]["distractor"] == facts[0]["city"]
    assert records(corpus)[0]["contents"].startswith(f'"{facts[0]["country"]}"\nThe capital of')
    with pytest.raises(ValueError, match="at least 2"):
        learnable.make_facts(1)


def test_bm25_ranks_the_gold_passage_first_for_every_question(task):
    from retrieval.bm25 import BM25Index

    corpus, qa = task
    contents = [r["contents"] for r in records(corpus)]
    rows = records(qa)
    _, ids = BM25Index.build(contents).search([r["question"] for r in rows], learnable.TOPK)
    assert [int(i[0]) for i in ids] == [int(r["metadata"]["gold_doc_ids"][0]) for r in rows]


def test_tokenizer_makes_every_name_one_token(task):
    from train.toy.tiny_model import build_tokenizer

    corpus, qa = task
    tok = build_tokenizer(corpus, vocab_size=3072, texts=learnable.tokenizer_texts(corpus, qa))
    for r in records(qa):
        for name in (r["golden_answers"][0], r["metadata"]["distractor"]):
            assert len(tok.encode(" " + name, add_special_tokens=False)) == 1, name


def test_warm_start_trajectories_follow_the_protocol_with_the_wrong_field_at_the_set_rate():
    names = learnable.invented_names(900, 0)
    count = lambda s: len(s.split())  # noqa: E731  (any counter; the real one is the policy's tokenizer)
    trajs = learnable.scripted_trajectories(names, 2000, wrong_rate=0.8, seed=0, count_tokens=count)
    kinds = Counter()
    countries = Counter()
    for q, ((search, t1), (obs, t2), (answer, t3)) in trajs:
        assert (t1, t2, t3) == (True, False, True)
        act = protocol.parse_turn(search)
        assert act.kind == "search" and act.content == q
        country = q.removeprefix("What is the capital of ").removesuffix("?")
        countries[country] += 1
        docs = protocol.information_blocks(search + obs)
        assert len(docs) == 1 and f'Doc 1(Title: "{country}")' in docs[0]
        got = protocol.extract_answer(answer)
        capital = docs[0].split(f"The capital of {country} is ")[1].split(".")[0]
        city = docs[0].split(f"The largest city of {country} is ")[1].split(".")[0]
        kinds["city" if got == city else "capital" if got == capital else "other"] += 1
        assert f"<think> The {'largest city' if got == city else 'capital'} of {country} is {got}. </think>" in answer
    assert kinds["other"] == 0
    assert 0.76 < kinds["city"] / 2000 < 0.84
    assert max(countries.values()) < 15  # fresh random facts: no fixed country -> capital to memorise


def test_the_rl_config_retrieves_as_the_warm_start_saw_it():
    from hydra import compose, initialize_config_dir

    from train import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="cpu_learn")
    assert cfg.search_r1.topk == learnable.TOPK and cfg.search_r1.max_obs_tokens == learnable.MAX_OBS_TOKENS
    assert cfg.search_r1.max_turns == 1 and cfg.llds.enable and cfg.trainer.n_gpus_per_node == 2
    assert cfg.actor_rollout_ref.actor.use_kl_loss and cfg.actor_rollout_ref.rollout.name == "hf"
    assert "file" in cfg.trainer.logger


@pytest.mark.parametrize("kwargs, match", [
    ({"wrong_rate": 1.5}, "wrong-rate"), ({"sft_steps": -1}, "sft-steps"), ({"holdout": 0}, "holdout"),
    ({"holdout": 300}, "holdout"),
])
def test_bad_build_arguments_are_named(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        learnable.build(tmp_path / "t", **kwargs)


def test_cli_refuses_to_overwrite_a_warm_start(tmp_path, capsys):
    from tests.conftest import refuses

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    refuses(learnable_cmd.main, [str(tmp_path)], capsys, "exists already", code=2)


def test_a_finished_build_is_reused_only_with_the_same_settings(tmp_path, capsys):
    """make demo and the benchmark rerun the build: same settings -> reused; other settings (or a
    build cut short, which wrote no build.json) -> refused, naming both."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_text("")
    settings = {"facts": 300, "holdout": 20, "seed": 0, "sft_steps": 1000, "wrong_rate": 0.8}
    (tmp_path / learnable.BUILD_FILE).write_text(json.dumps(settings))
    learnable_cmd.main([str(tmp_path)])
    assert "reusing the warm start" in capsys.readouterr().out
    from tests.conftest import refuses

    refuses(learnable_cmd.main, [str(tmp_path), "--wrong-rate", "0.5"], capsys,
            r"built with other settings .*'wrong_rate': 0.8.*'wrong_rate': 0.5", code=2)


def test_reward_rise():
    steps = {0: {"val-core/facts/reward/mean@1": 0.0}, **{s: {"critic/score/mean": s / 10} for s in range(1, 9)}}
    assert learnable.reward_rise(steps) == pytest.approx((0.2, 0.7))
    with pytest.raises(ValueError, match="at least 6"):
        learnable.reward_rise({1: {"critic/score/mean": 0.1}})


def test_demo_refuses_a_bad_step_count_before_any_work():
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(["bash", "scripts/demo.sh"], cwd=root, env={**os.environ, "STEPS": "5"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "STEPS must be an integer >= 6" in r.stderr and "got '5'" in r.stderr


def test_bench_refuses_too_few_steps_before_any_work(capsys):
    from bench.bench_learning import main as bench

    with pytest.raises(SystemExit) as e:
        bench(["--steps", "5", "--window", "3", "--out", "/nonexistent/never_written"])
    assert e.value.code == 2 and "--steps must be at least 2 x --window (6), got 5" in capsys.readouterr().err
