"""Faults during real training runs (verl's trainer on CPU, 2 ranks, reference model + KL, the
search_r1 agent loop against a retriever process): the retriever killed mid-step and restarted 20 s
later (in the learning run, tests/conftest.py ``learn_run``: one training start-up less), and SIGTERM
(as Slurm or Kubernetes send it), with and without a checkpoint on the way out."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.trainer import checkpoint_store

pytestmark = pytest.mark.slow  # make test-fast leaves these out

ROOT = Path(__file__).resolve().parents[2]
ENV = {"VERL_PLATFORM": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline",
       "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}


def test_retriever_outage_mid_step_is_waited_out_and_never_trained_on(learn_run):
    """The learning run's retriever process is SIGKILLed when search 20 of its last step (of about 64)
    arrives and started again 20 s later (longer than the client's retries, ~15 s; tests/conftest.py,
    ``learn_run``): the manager waits for /health, redoes the rollout, the step trains on no failed
    search and the run ends rc 0 (before the outage rule the step failed: more than half of its
    searches failed, or, under the threshold, they were trained on). The same run must still learn
    (tests/toy/test_learning_on_cpu.py)."""
    import json

    from tests.conftest import LEARN_STEPS

    run, steps = learn_run
    outage = json.loads((run / "outage.json").read_text())
    text = (run / "train.log").read_text(errors="replace")
    assert [e[0] for e in outage["events"]] == ["killed", "restarted"], outage
    assert outage["requests"] > outage["events"][1][1], outage  # searches after the restart: the redone rollout
    assert "unreachable or erroring; waiting for it" in text and "the retriever answers again; redoing" in text, \
        text[-5000:]
    m = steps[LEARN_STEPS]
    assert m["search_r1/searches"] > 0.5  # the policy searches
    assert m["search_r1/failed_searches"] == 0 and m["search_r1/outage_searches"] == 0, m


def wait_for(path: Path, needle: str, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {needle!r}:\n" + path.read_text()[-4000:])
        time.sleep(0.2)
    raise AssertionError(f"no {needle!r} within {timeout} s:\n" + path.read_text()[-4000:])


def ray_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "raylet|gcs_server"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_sigterm_exits_143_with_or_without_a_checkpoint(tmp_path, tiny_model_dir, bm25_server, qa_path):
    """SIGTERM to train.main exited 134 ("Aborted", Ray's handler, a stack dump). Now: with
    ``+trainer.save_on_sigterm=true`` the step in progress finishes, is saved (complete, tracked) and
    logged, then 143; a resumed run SIGTERMed without it abandons its step at once: 143, the tracker
    still names the saved step, and no Ray process is left."""
    from train.data_prep import main as prep
    from train.trainer.metrics_file import read_metrics

    prep(["--out", str(tmp_path / "data"), "--local", str(qa_path), "--holdout", "5"])
    ckpt = tmp_path / "ckpt"
    common = [sys.executable, "-m", "train.main", "--config-name", "cpu_smoke",
              f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={tmp_path / 'data/train.parquet'}",
              f"data.val_files={tmp_path / 'data/test.parquet'}", f"trainer.default_local_dir={ckpt}",
              f"search_r1.retriever_url={bm25_server.url}/retrieve", "search_r1.max_turn_tokens=16",
              "trainer.total_training_steps=3", "trainer.save_freq=-1", "trainer.resume_mode=auto",
              "trainer.logger=[console,file]"]
    before = ray_processes()

    def run(log: Path, extra, signal_after: str):
        with open(log, "w") as f:
            proc = subprocess.Popen([*common, *extra], cwd=ROOT, env={**os.environ, **ENV}, stdout=f,
                                    stderr=subprocess.STDOUT)
        try:
            wait_for(log, signal_after, proc, 600)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=600)
            return rc, time.monotonic() - t0, log.read_text(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()

    # "Training Progress:" is verl's progress bar, printed just before the first step: the signal comes
    # during step 1 (one that comes during start-up stops the run with nothing new to save, by design)
    rc, _, text = run(tmp_path / "save.log", ["+trainer.save_on_sigterm=true"], "Training Progress:")
    assert rc == 143, text[-5000:]
    assert "Aborted" not in text and "core dumped" not in text and "SIGTERM received" not in text, text[-5000:]
    # the step in progress when the signal came (step 1, unless the log reached us late)
    saved = int(text.split("SIGTERM: step ", 1)[1].split(" ", 1)[0])
    assert "saving its checkpoint, then stopping after the step" in text and saved < 3
    assert checkpoint_store.read_tracker(str(ckpt)) == (saved, None)
    assert checkpoint_store.problems(str(ckpt / f"global_step_{saved}")) == []
    assert (ckpt / f"global_step_{saved}" / "manifest.json").is_file()
    assert sorted(s for s, m in read_metrics(ckpt / "metrics.jsonl").items() if "critic/score/mean" in m) == \
        list(range(1, saved + 1))

    rc, took, text = run(tmp_path / "abandon.log", [], "Training Progress:")
    assert rc == 143 and took < 120, (rc, took, text[-5000:])
    assert f"checkpoints: resuming from {ckpt / f'global_step_{saved}'}" in text
    assert f"SIGTERM: stopped; the newest checkpoint is global_step_{saved}" in text, text[-3000:]
    assert "Aborted" not in text and "core dumped" not in text
    assert checkpoint_store.read_tracker(str(ckpt)) == (saved, None)
    assert checkpoint_store.saved_steps(str(ckpt)) == [saved]
    assert not (ckpt / ".stop_requested").exists()  # the first run's request was cleared at start
    time.sleep(3)
    assert ray_processes() == before, ray_processes()
