"""The pipeline learns: GRPO + LLDS on the learnable task (train/learnable.py) raises the reward.

The whole production path on CPU (configs/cpu_learn.yaml: verl's trainer, 2 ranks, reference model
+ KL, the search_r1 agent loop against a live BM25 server, the EM reward, the LLDS loss, the collapse
alarm), from the task's warm start, 10 steps, fixed seed. The threshold sits between the rise of
healthy runs and of sabotaged ones, both measured over seeds with bench/bench_learning.py (README,
"A CPU run that learns"): a flipped advantage sign (reward falls to 0) and a zeroed policy loss
(only the LLDS term is left, which learns, but slowly) both stay below it (tests/sabotage.py).
"""

import pytest

from train import learnable

STEPS = 10
SEED = 0
# mean reward of the last 3 steps minus the first 3: healthy runs 0.35-0.64 over 5 seeds, zeroed
# policy loss 0.14 or less, flipped advantage -0.07 (README, "A CPU run that learns")
MIN_RISE = 0.25


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    out = tmp_path_factory.mktemp("learn") / "task"
    learnable.build(out, progress=False)
    return out


@pytest.fixture(scope="module")
def task_server(task):
    from tests.conftest import LiveServer, free_port
    from retrieval.build import build_bm25
    from retrieval.index import load_retriever
    from retrieval.server import create_app

    index = build_bm25(str(task / "corpus.jsonl"), str(task / "bm25"), progress=False)
    server = LiveServer(create_app(load_retriever(index)), free_port())
    yield server
    server.close()


def test_grpo_llds_raises_the_reward(task, task_server, tmp_path):
    steps = learnable.run_rl(task, tmp_path / "run", task_server.url, steps=STEPS, seed=SEED,
                             overrides=["trainer.val_before_train=false", "trainer.test_freq=-1",
                                        f"trainer.save_freq={STEPS}"])
    train_steps = [s for s in sorted(steps) if "critic/score/mean" in steps[s]]
    assert train_steps == list(range(1, STEPS + 1))
    first, last = learnable.reward_rise(steps)
    rewards = [round(steps[s]["critic/score/mean"], 3) for s in train_steps]
    assert last - first >= MIN_RISE, f"reward did not rise enough: {first:.3f} -> {last:.3f}; per step {rewards}"
    for s in train_steps:
        m = steps[s]
        assert m["search_r1/searches"] > 0.5, (s, m["search_r1/searches"])  # it keeps searching
        assert "search_r1/lld_alarm" in m and "actor/llds/logp_pos_answer" in m and "actor/llds/penalty" in m
        assert m["actor/kl_loss"] >= 0
    assert sum("actor/llds/logp_pos" in steps[s] for s in train_steps) >= STEPS - 1  # NaN: no positive token
