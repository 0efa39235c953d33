"""The collapse warning live: a toy run with an injected fault (tests/sabotage.py's sabotage_unlikely: every
update lowers the likelihood of what the policy just sampled, whatever the reward, with no PPO clip) must raise
the alarm with the shipped levels, save the step and end the attempt, and with collapse_warning.action=rollback
go on from the checkpoint before the warning began with half the learning rate.
The advantage sign flipped (sabotage_flipped) is no such control: its push ends once every reward is 0, which
it reaches in 1-2 steps. With PPO's clip kept, the -1 advantage stopped pushing a token once its ratio fell
below 0.8, and the probe's drop stalled near 0.2-0.3 for ten steps in one of three runs (2026-12-07). Without
the clip it grew every step: ALARM at steps 4, 6 and 6 in three runs (the probe 0.28, 0.55, 1.17 at steps 2-4
in the first). The second attempt, at half the learning rate, may alarm again on any step up to the last
(exit 5) or not at all (exit 0); both ends are checked as what they must be.
The healthy run's side (no alarm) is asserted on the learning run (tests/toy/test_learning_on_cpu.py)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


@pytest.mark.slow
def test_an_injected_fault_raises_the_alarm_and_rollback_resumes_from_before_the_warning(
        learn_task, learn_bm25_index, tmp_path):
    """collapse_warning.action=rollback with one rollback allowed: the ALARM saves its step and stops the
    attempt; the run goes back to the checkpoint before the warning began, with half the learning rate, a
    fresh optimizer, the same probe, and the first attempt's checkpoints and metrics set aside. A second
    alarm would stop the run (exit 5; tests/trainer/test_rollback_on_cpu.py); whether the fault raises one
    again depends on whether any learning signal is left (with every reward 0 it is not), so both ends are
    checked as what they must be."""
    from train.trainer import checkpoint_store
    from train.trainer.metrics_file import read_metrics

    server = ServerProcess(learn_bm25_index, log=tmp_path / "retriever.log")
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false", "SEARCH_R1_PLUGINS": str(ROOT / "tests" / "sabotage.py")}
    ckpt = tmp_path / "ckpt"
    args = [sys.executable, "-m", "train.main", "--config-name", "cpu_learn",
            f"actor_rollout_ref.model.path={learn_task / 'model'}",
            f"data.train_files={learn_task / 'data' / 'train.parquet'}",
            f"data.val_files={learn_task / 'data' / 'test.parquet'}",
            f"trainer.default_local_dir={ckpt}", f"search_r1.retriever_url={server.url}/retrieve",
            f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.save_freq=1", "llds.enable=false", "data.seed=1", "actor_rollout_ref.rollout.seed=1",
            "actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_unlikely", "collapse_warning.action=rollback",
            "collapse_warning.max_rollbacks=1", "collapse_warning.rollback_lr_scale=0.5"]
    try:
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        server.close()
    out = r.stdout + r.stderr
    assert r.returncode in (0, 5), out[-6000:]
    rolled = [line for line in out.splitlines() if "collapse warning: rolling back (1 of" in line]
    assert len(rolled) == 1, out[-6000:]

    before = read_metrics(tmp_path / "metrics.jsonl.rolled_back_1")  # the first attempt, kept whole
    first = [s for s in sorted(before) if before[s].get("search_r1/warning", 0) >= 2]
    assert first and max(before) == first[0] < STEPS, {s: before[s].get("search_r1/warning") for s in before}
    assert f"collapse warning: ALARM at step {first[0]}" in out  # the console line names the signals
    began = first[0]  # the warning's first step: WATCH or above on every step from it to the alarm
    while began > 1 and before[began - 1].get("search_r1/warning", 0) >= 1:
        began -= 1
    target = began - 1  # save_freq=1: every step before it was saved
    assert (f"resuming from global_step_{target} " if target else "resuming from the model") in rolled[0], rolled
    moved = sorted(int(p.name.rsplit("_", 1)[1]) for p in (ckpt / "rolled_back_1").glob("global_step_*"))
    assert moved == list(range(target + 1, first[0] + 1)), (moved, target, first)
    assert checkpoint_store.problems(str(ckpt / "rolled_back_1" / f"global_step_{first[0]}")) == []

    after = read_metrics(tmp_path / "metrics.jsonl")  # the steps up to the target, then the second attempt
    assert [s for s in sorted(after) if s <= target] == list(range(1, target + 1))
    assert all(after[s] == before[s] for s in range(1, target + 1))
    assert {before[s]["actor/lr"] for s in before} == {5e-4}  # cpu_learn's learning rate, then half of it
    assert {after[s]["actor/lr"] for s in after if s > target} == {2.5e-4}
    assert "collapse warning: the probe's 8 trajectories restored" in out
    probe_after = [after[s]["probe/drop"] for s in sorted(after) if s > target]
    assert all(math.isfinite(d) for d in probe_after)  # the same probe, scored from the first step resumed
    again = [s for s in sorted(after) if s > target and after[s].get("search_r1/warning", 0) >= 2]
    if r.returncode == 5:  # alarmed again: no rollback left, so it stopped there, saved
        error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert len(error) == 1 and "after 1 rollback(s) (collapse_warning.max_rollbacks=1)" in error[0], out[-4000:]
        assert again and max(after) == again[0] and f"saved as global_step_{again[0]}" in error[0]
    else:
        assert not again and max(after) == STEPS, {s: after[s].get("search_r1/warning") for s in after}
    assert not (ckpt / ".collapse_stop").exists()
