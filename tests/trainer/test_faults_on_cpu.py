"""Faults that must never cost a run or a result (issue 21), reproduced on files and small servers:
resume lands on the newest complete checkpoint, the tracker is written atomically, a full disk is
named, metrics survive a restart, bad gold answers stop a run before Ray starts, the evaluator never
keeps a failed search, timeouts say so, and a run never joins somebody else's Ray cluster. The
training-run faults (retriever outage mid-step, SIGTERM) are in tests/trainer/test_fault_runs_on_cpu.py."""

import asyncio
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.trainer import checkpoint_store, metrics_file

ROOT = Path(__file__).resolve().parents[2]


# -- checkpoints --------------------------------------------------------------------------------------

def fake_checkpoint(root: Path, step: int, world: int = 2, manifest: bool = True, tracker: bool = True) -> Path:
    """What verl's save writes for a 2-rank FSDP actor (shards per rank, fsdp_config.json, data.pt),
    plus our manifest and tracker."""
    import torch

    folder = root / f"global_step_{step}"
    actor = folder / "actor"
    actor.mkdir(parents=True)
    for rank in range(world):
        for kind in ("model", "optim", "extra_state"):
            torch.save({"w": torch.full((256,), float(rank + step))},
                       actor / f"{kind}_world_size_{world}_rank_{rank}.pt")
    (actor / "fsdp_config.json").write_text("{}")
    torch.save({"epoch": 0, "step": step}, folder / "data.pt")
    if manifest:
        checkpoint_store.write_manifest(str(folder))
    if tracker:
        checkpoint_store.write_tracker(str(root), step)
    return folder


def truncate(path: Path, keep: int = 100) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


def test_complete_checkpoints_have_no_problems(tmp_path):
    for manifest in (True, False):
        folder = fake_checkpoint(tmp_path / str(manifest), 1, manifest=manifest)
        assert checkpoint_store.problems(str(folder)) == []
    manifest = json.loads((tmp_path / "True" / "global_step_1" / "manifest.json").read_text())
    assert "actor/model_world_size_2_rank_1.pt" in manifest["files"] and "data.pt" in manifest["files"]
    assert manifest["bytes"] == sum(manifest["files"].values())


def test_tracker_naming_a_missing_folder_resumes_from_the_newest_complete(tmp_path):
    """verl: "Checkpoint does not exist", then training from scratch over steps 1 and 2."""
    fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    said = []
    assert checkpoint_store.prepare_resume(str(tmp_path), "auto", log=said.append) == 2
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert any("named step 3, which does not exist" in s for s in said), said


@pytest.mark.parametrize("content", ["", "\n", "garbage"])
def test_empty_or_garbled_tracker_resumes_from_the_newest_complete(tmp_path, content):
    """verl: ValueError: invalid literal for int(). A full disk at the first save left it at 0 bytes."""
    fake_checkpoint(tmp_path, 1)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(content)
    assert checkpoint_store.prepare_resume(str(tmp_path), "auto", log=lambda m: None) == 1
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"


@pytest.mark.parametrize("manifest", [True, False])
def test_truncated_newest_shard_falls_back_to_the_one_before(tmp_path, manifest):
    """verl: "PytorchStreamReader failed reading zip archive" after start-up, no file named."""
    fake_checkpoint(tmp_path, 1, manifest=manifest)
    newest = fake_checkpoint(tmp_path, 2, manifest=manifest)
    truncate(newest / "actor" / "model_world_size_2_rank_1.pt")
    bad = checkpoint_store.problems(str(newest))
    assert len(bad) == 1 and "model_world_size_2_rank_1.pt" in bad[0]
    said = []
    assert checkpoint_store.prepare_resume(str(tmp_path), "auto", log=said.append) == 1
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert not newest.exists() and (tmp_path / "incomplete_global_step_2" / "actor").is_dir()  # kept, aside
    assert any("global_step_2 is incomplete" in s and "rank_1" in s for s in said), said
    assert checkpoint_store.saved_steps(str(tmp_path)) == [1]  # retention no longer counts it


def test_a_save_cut_short_is_incomplete(tmp_path):
    """No manifest: a missing rank, or data.pt (verl writes it after every shard) not there."""
    a = fake_checkpoint(tmp_path / "a", 1, manifest=False)
    (a / "actor" / "optim_world_size_2_rank_1.pt").unlink()
    assert any("optim shards of ranks [1] of 2 are missing" in p for p in checkpoint_store.problems(str(a)))
    b = fake_checkpoint(tmp_path / "b", 1, manifest=False)
    (b / "data.pt").unlink()
    assert any("data.pt is missing" in p for p in checkpoint_store.problems(str(b)))
    c = fake_checkpoint(tmp_path / "c", 1)  # with a manifest: a listed file gone
    (c / "actor" / "fsdp_config.json").unlink()
    assert any("fsdp_config.json is missing" in p for p in checkpoint_store.problems(str(c)))


def test_refuses_to_start_over_while_checkpoints_exist(tmp_path):
    only = fake_checkpoint(tmp_path, 1)
    truncate(only / "data.pt")
    with pytest.raises(checkpoint_store.CheckpointError, match="refusing to train from scratch.*resume_mode=disable"):
        checkpoint_store.prepare_resume(str(tmp_path), "auto", log=lambda m: None)
    assert only.exists()  # nothing moved when nothing is complete
    said = []
    assert checkpoint_store.prepare_resume(str(tmp_path), "disable", log=said.append) == 0
    assert "from scratch" in said[0]
    # a tracker but no folder at all: restore them, or say so
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "latest_checkpointed_iteration.txt").write_text("5")
    with pytest.raises(checkpoint_store.CheckpointError, match="names step 5 but"):
        checkpoint_store.prepare_resume(str(empty), "auto")
    assert checkpoint_store.prepare_resume(str(tmp_path / "new"), "auto") == 0  # a fresh run


def test_resume_path_must_be_complete_and_errors_name_the_file(tmp_path):
    folder = fake_checkpoint(tmp_path, 4)
    assert checkpoint_store.prepare_resume(str(tmp_path), "resume_path", str(folder), log=lambda m: None) == 4
    truncate(folder / "actor" / "extra_state_world_size_2_rank_0.pt")
    with pytest.raises(checkpoint_store.CheckpointError, match="extra_state_world_size_2_rank_0.pt has 100 bytes"):
        checkpoint_store.prepare_resume(str(tmp_path), "resume_path", str(folder))
    with pytest.raises(checkpoint_store.CheckpointError, match="must name a global_step_N folder"):
        checkpoint_store.prepare_resume(str(tmp_path), "resume_path", str(tmp_path))


def test_tracker_write_is_atomic(tmp_path, monkeypatch):
    """A failed write (the disk filled up) leaves the tracker as it was, not at 0 bytes."""
    checkpoint_store.write_tracker(str(tmp_path), 1)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_store.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint_store.write_tracker(str(tmp_path), 2)
    monkeypatch.undo()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest_checkpointed_iteration.txt"]  # no temp left


def test_full_disk_is_named_before_and_during_a_save(tmp_path, monkeypatch):
    import shutil

    fake_checkpoint(tmp_path, 1)
    size = checkpoint_store.checkpoint_bytes(str(tmp_path / "global_step_1"))
    monkeypatch.setattr(checkpoint_store.shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**9, 10**9, size // 2))
    with pytest.raises(checkpoint_store.CheckpointError) as e:
        checkpoint_store.check_free_space(str(tmp_path), 2, 1)
    assert f"no space left on {tmp_path} for global_step_2" in str(e.value) and f"{size:,}" in str(e.value)
    message = checkpoint_store.describe_save_failure(str(tmp_path), 2, RuntimeError("basic_ios::clear: iostream error"))
    assert message.startswith(f"no space left on {tmp_path} while saving global_step_2")
    assert "newest complete checkpoint is global_step_1" in message and "iostream error" in message
    monkeypatch.undo()
    checkpoint_store.check_free_space(str(tmp_path), 2, 1)  # room enough: no error


# -- metrics ------------------------------------------------------------------------------------------

def write_rows(path: Path, steps) -> None:
    path.write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": s / 10}}) + "\n" for s in steps))


def test_verl_file_logger_truncates_and_ours_appends(tmp_path, monkeypatch):
    """The defect (verl opens the file with "wb"), then the fix: keep the steps up to the resume
    step, append the new ones; the plot reads one continuous curve."""
    from verl.utils.tracking import FileLogger, Tracking

    from train.plot import main as plot
    from train.trainer.metrics_file import read_metrics

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    write_rows(path, range(0, 6))
    FileLogger("p", "e").finish()
    assert path.read_text() == ""  # verl's own logger wiped steps 0-5

    write_rows(path, range(0, 6))
    with path.open("a") as f:
        f.write('{"step": 6, "data": {"critic/sc')  # a line cut by a crash
    said = []
    assert metrics_file.keep_until(str(path), 3, log=said.append) == 4
    assert "steps 4-5 dropped" in said[0]  # and the cut line
    with metrics_file.appending():
        logger = Tracking("p", "e", default_backend=["file"])
        for step in (3, 4, 5):
            logger.log({"critic/score/mean": 1.0 + step}, step=step)
        logger.finish()
    from verl.utils import tracking

    assert tracking.FileLogger is FileLogger
    steps = read_metrics(path)
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]
    assert [r["step"] for r in metrics_file.read_rows(str(path))] == [0, 1, 2, 3, 3, 4, 5]  # step 3 twice: old + new
    assert steps[4]["critic/score/mean"] == 5.0
    plot([str(tmp_path)])
    assert (tmp_path / "plots" / "reward.png").stat().st_size > 0


def test_a_run_from_scratch_moves_old_metrics_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_rows(path, [1, 2])
    said = []
    metrics_file.keep_until(str(path), 0, log=said.append)
    assert not path.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("metrics.jsonl.")]
    assert len(aside) == 1 and "moved to" in said[0] and len(aside[0].read_text().splitlines()) == 2


def test_metrics_live_beside_the_checkpoints(tmp_path):
    assert metrics_file.path_for(["console", "wandb", "file"], str(tmp_path / "ckpt"), environ={}) == \
        str(tmp_path / "ckpt" / "metrics.jsonl")
    assert metrics_file.path_for(["console"], str(tmp_path), environ={}) is None
    assert metrics_file.path_for("file", "x", environ={"VERL_FILE_LOGGER_PATH": "rel/m.jsonl"}) == \
        os.path.abspath("rel/m.jsonl")


# -- gold answers -------------------------------------------------------------------------------------

def parquet_with_golds(path: Path, golds: list) -> Path:
    import pandas as pd

    rows = [{"data_source": "nq", "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "qa",
             "reward_model": {"style": "rule", "ground_truth": {"target": g}},
             "extra_info": {"split": "train", "index": i, "uid": f"nq-train-{i}"}} for i, g in enumerate(golds)]
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.mark.parametrize("bad,match", [([""], "target\\[0\\] is empty"), (["  "], "is empty"),
                                       ([], "no gold answer"), (None, "no gold answer"),
                                       (["Paris", ""], "target\\[1\\] is empty")])
def test_bad_golds_are_named_by_file_row_and_uid(tmp_path, bad, match):
    from train.trainer.preflight import check_data_file

    path = parquet_with_golds(tmp_path / "train.parquet", [["Paris"], ["Rome"], bad])
    with pytest.raises(ValueError, match=match) as e:
        check_data_file(str(path), "data.train_files")
    assert f"{path} row 2 (uid 'nq-train-2')" in str(e.value)


def test_data_files_that_are_missing_or_not_parquet(tmp_path):
    from train.trainer.preflight import check_data_file

    with pytest.raises(ValueError, match="does not exist"):
        check_data_file(str(tmp_path / "nope.parquet"), "data.train_files")
    (tmp_path / "train.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="is not a parquet file"):
        check_data_file(str(tmp_path / "train.jsonl"), "data.train_files")
    said = []
    ok = parquet_with_golds(tmp_path / "ok.parquet", [["Paris"], ["A"]])  # "A" normalises to nothing: kept, noted
    assert check_data_file(str(ok), "data.val_files", log=said.append) == 2
    assert "1 rows have a gold answer that is empty once normalised" in said[0]


def test_reward_error_names_the_uid():
    from train.search_r1.reward import compute_score

    for bad in ([], None, [""]):
        with pytest.raises(ValueError, match="uid 'nq-train-7'"):
            compute_score("nq", "<answer> . </answer>", {"target": bad}, {"uid": "nq-train-7"})
    assert compute_score("nq", "<answer> Paris </answer>", {"target": ["paris"]}, {"uid": "u"})["score"] == 1.0


@pytest.mark.slow
def test_train_main_stops_on_a_bad_gold_before_ray(tmp_path, tiny_model_dir):
    path = parquet_with_golds(tmp_path / "train.parquet", [["Paris"], [""]])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "train.main", "--config-name", "cpu_smoke",
                        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={path}",
                        f"data.val_files={path}", f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
                       cwd=ROOT, env={**os.environ, "VERL_PLATFORM": "cpu"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and f"error: data.train_files: {path} row 1 (uid 'nq-train-1')" in r.stderr, \
        r.stderr[-3000:]
    assert "ray: starting" not in r.stdout and time.monotonic() - t0 < 120


# -- evaluation with the retriever going down ---------------------------------------------------------

@pytest.mark.slow
def test_evaluation_never_keeps_a_failed_search(tmp_path, tiny_tokenizer, bm25_index_dir, qa_path):
    """The retriever dies after 9 of 20 questions: nothing after that is written as a result, the run
    stops with rc 3 saying how many rows are affected, and a rerun with the retriever back evaluates
    exactly the rest (today: 11 rows with "search failed" and EM 0 kept, rc 0, rerun resumes 20 of 20)."""
    from tests.inference.test_infer_eval_on_cpu import ScriptedByQuestion
    from train import evaluate
    from train.data_prep import main as prep
    from train.evaluation import results as eval_results

    prep(["--out", str(tmp_path / "data"), "--local", str(qa_path), "--holdout", "10"])
    rows = eval_results.load_rows(str(tmp_path / "data" / "test.parquet"), None, None)
    assert len(rows) == 20
    from train.search_r1.prompts import normalize_question

    answers = {normalize_question(r["question"]): r["golds"][0] for r in rows}
    from tests.conftest import ServerProcess

    server = ServerProcess(bm25_index_dir)

    class DiesAfter(ScriptedByQuestion):
        asked: list = []

        async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kw):
            text = self.tokenizer.decode(prompt_ids)
            question = text.split("Question: ", 1)[1].split("\n", 1)[0]
            if question not in self.asked:
                self.asked.append(question)
                if len(self.asked) == 10:
                    server.kill()
            return await super().generate(prompt_ids=prompt_ids, sampling_params=sampling_params)

    out = tmp_path / "eval.jsonl"
    args = ["--model", "tiny", "--data", str(tmp_path / "data" / "test.parquet"), "--retriever-url", server.url,
            "--out", str(out), "--concurrency", "1"]
    try:
        rc = evaluate.main(args, generator=DiesAfter(tiny_tokenizer, answers))
        assert rc == 3
        written = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(written) == 9 and all(d["em"] == 1.0 and d["failed_searches"] == 0 for d in written)
        server.start()
        rc = evaluate.main(args, generator=ScriptedByQuestion(tiny_tokenizer, answers))
        assert rc == 0
        final = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(final) == 20 and sorted(d["uid"] for d in final) == sorted(r["uid"] for r in rows)
        assert all(d["em"] == 1.0 for d in final)
    finally:
        server.close()


def test_evaluation_stops_when_the_retriever_is_down_and_redoes_old_failed_rows(tmp_path, tiny_tokenizer, capsys):
    from retrieval.client import RetrievalClient
    from tests.conftest import free_port
    from tests.inference.test_infer_eval_on_cpu import ScriptedByQuestion
    from train import evaluate
    from train.evaluation import results as eval_results
    from train.evaluation import runner as eval_runner
    from train.inference.asker import Asker
    from train.inference.settings import AskSettings
    from train.search_r1 import protocol

    rows = [{"uid": f"u{i}", "data_source": "nq", "question": f"question {i}?", "golds": ["x"]} for i in range(40)]
    out = tmp_path / "out.jsonl"
    # a file from an older version: row u0 was kept with a failed search
    out.write_text(json.dumps({"uid": "u0", "data_source": "nq", "question": "question 0?", "golds": ["x"], "em": 0.0,
                               "f1": 0.0, "trajectory": protocol.format_search_failure()}) + "\n")
    assert eval_results.read_done(out) == {}
    assert "1 rows saw a failed search; they are redone" in capsys.readouterr().out
    client = RetrievalClient(f"http://127.0.0.1:{free_port()}", retries=0, timeout=2)  # nothing listens there
    asker = Asker(ScriptedByQuestion(tiny_tokenizer), tiny_tokenizer, client, AskSettings(model=None, concurrency=2))
    with pytest.raises(evaluate.RetrieverDown) as e:
        asyncio.run(eval_runner.evaluate(rows, asker, out))
    message, partial = str(e.value), e.value.results
    assert partial == [] and "stopped early" in message and "rows were not started" in message
    assert out.read_text() == ""  # nothing but results is written


# -- messages -----------------------------------------------------------------------------------------

def test_a_timed_out_search_says_so(tiny_tokenizer, caplog):
    """Logged today as "retriever unavailable", without the timeout or its setting."""
    from retrieval.client import RetrievalClient
    from train.search_r1.agent_loop import standalone_loop

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"

    async def go():
        loop = standalone_loop(tiny_tokenizer, None, search={"timeout": 0.5, "retries": 0},
                               search_client=RetrievalClient(url, timeout=0.5, retries=0))
        return await loop._observe("who wrote it")

    try:
        with caplog.at_level(logging.WARNING, logger="train.search_r1.agent_loop"):
            obs, status = asyncio.run(go())
    finally:
        listener.close()
    assert status == "outage" and "Search failed" in obs
    text = caplog.text
    assert "gave no complete answer within 0.5 s" in text and "search_r1.timeout=0.5 s" in text, text


# -- Ray ----------------------------------------------------------------------------------------------

INIT = """
import sys
from hydra import compose, initialize_config_dir
from train import CONFIG_DIR
from train.trainer.ray_setup import init_ray
import ray
with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
    cfg = compose(config_name="cpu_smoke")
init_ray(cfg, cpu=True)
print("GCS", ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


@pytest.mark.slow
def test_a_run_starts_its_own_ray_unless_told_to_join(tmp_path):
    """With a cluster left running on the machine (by multinode.sh, say), a bare ray.init() joins it
    and the CPU path's num_gpus made Ray refuse."""
    from tests.conftest import free_port

    ray_bin = Path(sys.executable).parent / "ray"
    port = free_port()
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("RAY_ADDRESS")
    up = subprocess.run([str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                         "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        own = subprocess.run([sys.executable, "-c", INIT], cwd=ROOT, env={**env, "VERL_PLATFORM": "cpu"},
                             capture_output=True, text=True, timeout=300)
        assert own.returncode == 0, own.stderr[-3000:]
        assert "ray: starting a Ray instance for this run" in own.stdout
        assert f":{port}" not in own.stdout.split("GCS", 1)[1]
        join_env = {**env, "VERL_PLATFORM": "cpu", "RAY_ADDRESS": f"127.0.0.1:{port}"}
        refused = subprocess.run([sys.executable, "-c", INIT], cwd=ROOT, env={**join_env, "RAY_AUTH_MODE": "disabled"},
                                 capture_output=True, text=True, timeout=300)
        if refused.returncode != 0:  # the installed Ray authenticates by token: the error says what to set
            assert "set RAY_AUTH_MODE=token" in refused.stderr, refused.stderr[-3000:]
        joined = subprocess.run([sys.executable, "-c", INIT], cwd=ROOT, env={**join_env, "RAY_AUTH_MODE": "token"},
                                capture_output=True, text=True, timeout=300)
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert f"ray: joining the Ray cluster at 127.0.0.1:{port} (RAY_ADDRESS)" in joined.stdout
        assert "num_cpus" in joined.stdout and f":{port}" in joined.stdout.split("GCS", 1)[1]
    finally:
        from tests.conftest import stop_ray_processes

        stop_ray_processes(f":{port}")  # this cluster only (`ray stop` would kill every cluster of the machine)
    time.sleep(1)
    left = subprocess.run(["pgrep", "-af", f"gcs_server_port={port}"], capture_output=True, text=True).stdout
    assert not [line for line in left.splitlines() if "pgrep" not in line], left  # its GCS server included


# -- the outage rule of the agent loop manager (the whole run: tests/trainer/test_fault_runs_on_cpu.py) ---------

class FakeOut:
    def __init__(self, outage: int, valid: int = 10, other: int = 0):
        self.non_tensor_batch = {"num_outage_searches": [outage], "num_failed_searches": [outage + other],
                                 "num_valid_searches": [valid]}
        self.meta_info = {}


def manager(monkeypatch, outputs, healthy=True, **search):
    from omegaconf import OmegaConf

    from train.search_r1 import rollout_manager

    calls, waits = [], []

    async def generate(self, prompts):
        calls.append(prompts)
        return outputs.pop(0)

    async def wait(url, seconds, **kw):
        waits.append(round(seconds))
        return healthy(url) if callable(healthy) else healthy

    monkeypatch.setattr(rollout_manager.AgentLoopManager, "generate_sequences", generate)
    monkeypatch.setattr(rollout_manager, "wait_healthy_async", wait)
    mgr = object.__new__(rollout_manager.SearchR1AgentLoopManager)
    mgr.config = OmegaConf.create({"search_r1": {"outage_wait_s": 5, **search}})
    return mgr, calls, waits


def test_manager_redoes_a_rollout_that_hit_an_outage(monkeypatch, capsys):
    clean = FakeOut(0)
    mgr, calls, waits = manager(monkeypatch, [FakeOut(3), clean])
    assert mgr.generate_sequences("prompts") is clean
    assert len(calls) == 2 and waits == [5]
    assert "3 of 13 searches in this rollout failed" in capsys.readouterr().out


def test_manager_waits_for_every_nodes_replica(monkeypatch):
    """With a replica on every node, the driver waits for each node's after an outage (its own node's
    answering says nothing of the others'), and names the one that stayed down."""
    from train.search_r1 import rollout_manager

    replicas = ["http://10.0.0.1:8000/retrieve", "http://10.0.0.2:8000/retrieve"]
    monkeypatch.setattr(rollout_manager, "every_replica", lambda url: replicas if "{node_ip}" in url else [url])
    asked = []
    mgr, calls, waits = manager(monkeypatch, [FakeOut(3)], healthy=lambda u: asked.append(u) or "10.0.0.1" in u,
                                retriever_url="http://{node_ip}:8000/retrieve")
    with pytest.raises(RuntimeError, match=r"the retriever at http://10.0.0.2:8000/retrieve did not answer /health"):
        mgr.generate_sequences("prompts")
    assert asked == replicas
    clean = FakeOut(0)
    mgr, calls, waits = manager(monkeypatch, [FakeOut(3), clean], retriever_url="http://{node_ip}:8000/retrieve")
    assert mgr.generate_sequences("prompts") is clean and len(waits) == 2


def test_every_replica_lists_each_alive_nodes_address(monkeypatch):
    import ray

    from train.search_r1.config import every_replica

    assert every_replica("http://10.0.0.1:8000/retrieve") == ["http://10.0.0.1:8000/retrieve"]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "NodeManagerAddress": "10.0.0.2"},
                                               {"Alive": False, "NodeManagerAddress": "10.0.0.3"},
                                               {"Alive": True, "NodeManagerAddress": "10.0.0.1"}])
    assert every_replica("http://{node_ip}:8000/retrieve") == ["http://10.0.0.1:8000/retrieve",
                                                               "http://10.0.0.2:8000/retrieve"]


def test_manager_stops_when_the_retriever_stays_down_or_keeps_failing(monkeypatch):
    mgr, calls, _ = manager(monkeypatch, [FakeOut(3)], healthy=False)
    with pytest.raises(RuntimeError, match="did not answer /health within search_r1.outage_wait_s=5"):
        mgr.generate_sequences("prompts")
    mgr, calls, waits = manager(monkeypatch, [FakeOut(3), FakeOut(2), FakeOut(1)], outage_redos=2)
    with pytest.raises(RuntimeError, match="failed 1 of 11 searches again, in 3 rollouts"):
        mgr.generate_sequences("prompts")
    assert len(calls) == 3 and len(waits) == 2
    # never waiting: the outage failures count toward max_failure_rate, as other failures do
    mgr, calls, waits = manager(monkeypatch, [FakeOut(8, valid=2)], outage_wait_s=0)
    with pytest.raises(RuntimeError, match="8 of 10 searches in this step failed"):
        mgr.generate_sequences("prompts")
    assert waits == []
