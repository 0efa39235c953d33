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


class FakeBench:
    """Stands in for bench_smollm2.Bench: the data and warm start are there; evaluate() writes ``rows``."""

    def __init__(self, rows):
        self.rows, self.evaluated = rows, 0

    def part_data(self):
        pass

    def part_warm(self):
        pass

    def evaluate(self, model, method, backend, out, extra=()):
        self.evaluated += 1
        smollm2_corpus.write_rows(self.rows, out)
        return 1.0


def study_runner(tmp_path, monkeypatch, weights, rows, recorded_id="aaa"):
    import argparse
    import json

    corpus, study = tmp_path / "corpus", tmp_path / "study"
    (corpus / "smollm2").mkdir(parents=True)
    (corpus / "smollm2" / "grpo-s0.jsonl").write_text(json.dumps({"run": {"warm_start": recorded_id}}) + "\n")
    recorded = [{"uid": f"q{i:03d}", "em": float(i % 5 == 0), "answer": f"a{i}", "searches": 1} for i in range(100)]
    smollm2_corpus.write_rows(recorded, smollm2_corpus.heldout_file(study, "warm_start"))
    monkeypatch.setattr(smollm2_corpus, "warm_start_id", lambda sft: weights)
    monkeypatch.setattr("train.models.registry.resolve", lambda name: name)
    runner = smollm2_corpus.Runner.__new__(smollm2_corpus.Runner)
    runner.a, runner.corpus, runner.study = argparse.Namespace(commit=False), corpus, study
    runner.work, runner.sft, runner.bench = tmp_path / "work", tmp_path / "sft", FakeBench(rows)
    return runner, recorded


def test_the_study_warm_start_is_used_as_is(tmp_path, monkeypatch):
    runner, _ = study_runner(tmp_path, monkeypatch, "aaa", rows=[])
    assert runner.prepare() == ("aaa", "aaa", None) and runner.bench.evaluated == 0


def test_a_rebuilt_warm_start_counts_as_the_study_one_only_when_it_answers_alike(tmp_path, monkeypatch):
    runner, recorded = study_runner(tmp_path, monkeypatch, "bbb", rows=[])
    close = [dict(r) for r in recorded]
    for r in close[1:9]:  # 8 answers of 100 differ, EM unchanged: within the tolerance
        r["answer"] = "other"
    runner.bench.rows = close
    study, weights, check = runner.prepare()
    assert (study, weights, check["answers_equal"], check["same"]) == ("aaa", "bbb", 0.92, True)
    assert check["differ"] == ["q001", "q002", "q003", "q004", "q005"] and runner.bench.evaluated == 1

    far = [dict(r) for r in recorded]
    for r in far[1:12]:  # 11 of 100 differ
        r["answer"] = "other"
    runner.bench.rows = far
    with pytest.raises(SystemExit, match=r"not the study's \(aaa\).* on 89.0% of the questions \(first differing: q0"):
        runner.prepare()
    em_moved = [dict(r) for r in recorded]
    for r in em_moved[1:3]:  # 2 of 100 differ, both now right: EM +0.02
        r.update(answer="right", em=1.0)
    runner.bench.rows = em_moved
    with pytest.raises(SystemExit, match=r"EM 0\.220 against 0\.200"):
        runner.prepare()
    runner.bench.rows = recorded[:89]  # questions lost count as differences
    with pytest.raises(SystemExit, match="89.0%"):
        runner.prepare()


def test_a_rebuilt_warm_start_with_no_recorded_rows_to_check_against_is_refused(tmp_path, monkeypatch):
    runner, _ = study_runner(tmp_path, monkeypatch, "bbb", rows=[])
    smollm2_corpus.heldout_file(runner.study, "warm_start").unlink()
    with pytest.raises(SystemExit, match="missing, and the warm start here .* not the one the recorded runs name"):
        runner.prepare()
