"""The pipeline learns: GRPO, with and without LLDS, on the learnable task (train/learnable.py)
raises the reward.

The whole production path on CPU (configs/cpu_learn.yaml: verl's trainer, 2 ranks, reference model
+ KL, the search_r1 agent loop against a live BM25 server, the EM reward, the LLDS loss, the collapse
alarm), from the task's warm start, fixed seeds. The threshold comes from the spread measured over
seeds with bench/bench_learning.py (README, "A CPU run that learns"). A flipped advantage sign fails
both runs; a zeroed policy loss fails the LLDS-off run (with LLDS on, the LLDS term alone still
raises the likelihood of rewarded answers, and the reward); tests/sabotage.py and the same script
show both.
"""

import pytest

from train import learnable

STEPS = 20
SEED = 0
MIN_RISE = 0.15  # mean reward, last 3 steps minus first 3; see the README for the seeds it comes from


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("learn") / "task"
    learnable.build(out, progress=False)
    return out


@pytest.fixture(scope="module")
def task_server(task):
    from conftest import LiveServer, free_port
    from retrieval.build import build_bm25
    from retrieval.index import load_retriever
    from retrieval.server import create_app

    index = build_bm25(str(task / "corpus.jsonl"), str(task / "bm25"), progress=False)
    server = LiveServer(create_app(load_retriever(index)), free_port())
    yield server
    server.close()


@pytest.mark.parametrize("llds", ["true", "false"], ids=["grpo_llds", "grpo"])
def test_training_raises_the_reward(task, task_server, tmp_path, llds):
    steps = learnable.run_rl(task, tmp_path / "run", task_server.url, steps=STEPS, seed=SEED,
                             overrides=["trainer.val_before_train=false", "trainer.test_freq=-1",
                                        f"trainer.save_freq={STEPS}", f"llds.enable={llds}"])
    train_steps = [s for s in sorted(steps) if "critic/score/mean" in steps[s]]
    assert train_steps == list(range(1, STEPS + 1))
    first, last = learnable.reward_rise(steps)
    rewards = [round(steps[s]["critic/score/mean"], 3) for s in train_steps]
    assert last - first >= MIN_RISE, f"reward did not rise enough: {first:.3f} -> {last:.3f}; per step {rewards}"
    for s in train_steps:
        m = steps[s]
        assert m["search_r1/searches"] > 0.5, (s, m["search_r1/searches"])  # it keeps searching
        assert "search_r1/lld_alarm" in m and "actor/llds/logp_pos_answer" in m
        assert ("actor/llds/penalty" in m) == (llds == "true")
        assert m["actor/kl_loss"] >= 0
    assert sum("actor/llds/logp_pos" in steps[s] for s in train_steps) >= STEPS - 2  # NaN: no positive token
