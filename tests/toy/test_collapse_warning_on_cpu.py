"""The collapse warning live: a toy run with an injected fault (the advantage sign flipped, so the policy is
pushed away from what the reward favours: a positive control, bench/collapse_corpus.py's fault_flipped)
must raise the alarm, and with collapse_warning.action=stop save the step and exit 5 naming the signals.
The healthy run's side (no alarm) is asserted on the learning run (tests/toy/test_learning_on_cpu.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
#: the corpus's fault_flipped run of seed 1 reached the probe's ALARM level at step 4 (bench/collapse_corpus/)
STEPS = 10


@pytest.mark.slow
def test_an_injected_fault_raises_the_alarm_and_stop_saves_and_exits_5(learn_task, learn_bm25_index, tmp_path):
    from train.trainer.metrics_file import read_metrics

    server = ServerProcess(learn_bm25_index, log=tmp_path / "retriever.log")
    env = {**os.environ, "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": str(tmp_path / "metrics.jsonl"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
           "TOKENIZERS_PARALLELISM": "false", "SEARCH_R1_PLUGINS": str(ROOT / "tests" / "sabotage.py")}
    args = [sys.executable, "-m", "train.main", "--config-name", "cpu_learn",
            f"actor_rollout_ref.model.path={learn_task / 'model'}",
            f"data.train_files={learn_task / 'data' / 'train.parquet'}",
            f"data.val_files={learn_task / 'data' / 'test.parquet'}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"search_r1.retriever_url={server.url}/retrieve",
            f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.save_freq=-1", "llds.enable=false", "data.seed=1", "actor_rollout_ref.rollout.seed=1",
            "actor_rollout_ref.actor.policy_loss.loss_mode=sabotage_flipped", "collapse_warning.action=stop"]
    try:
        r = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    finally:
        server.close()
    out = r.stdout + r.stderr
    assert r.returncode == 5, out[-6000:]
    error = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "the collapse warning stopped the run at step" in error[0], out[-4000:]
    steps = read_metrics(tmp_path / "metrics.jsonl")
    alarmed = [s for s in sorted(steps) if steps[s].get("search_r1/warning", 0) >= 2]
    assert alarmed and max(steps) == alarmed[0] < STEPS, {s: steps[s].get("search_r1/warning") for s in steps}
    assert f"saved as global_step_{alarmed[0]}" in error[0]
    assert (tmp_path / "ckpt" / f"global_step_{alarmed[0]}" / "actor").is_dir()
    assert f"collapse warning: ALARM at step {alarmed[0]}" in out  # the console line names the signals
    assert not (tmp_path / "ckpt" / ".collapse_stop").exists()
