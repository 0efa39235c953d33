"""What verl finds only after Ray starts, or never (a trainer waiting forever), is found by
``train.main`` first and named: rollout batches the agent workers cannot split (the 3- and 6-GPU
geometry), a train file smaller than one batch, FSDP1 on CPU, a model path that does not exist, and
more ranks than the Ray cluster has GPUs."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from train import CONFIG_DIR
from train.trainer import preflight
from train.trainer.batch_geometry import check_split, ten_update_geometry

ROOT = Path(__file__).resolve().parents[2]


def load(name, overrides=()):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_the_geometry_splits_over_ranks_and_agent_workers():
    """verl's agent loop manager splits each rollout batch over its 8 agent workers: the old geometry
    gave 510 prompts x 5 = 2,550 trajectories on 3 GPUs and 540 x 5 = 2,700 on 6, and the first rollout
    crashed with "only support equal chunk"."""
    with pytest.raises(ValueError, match="2550 trajectories do not split over "
                                         "actor_rollout_ref.rollout.agent.num_workers=8"
                                         ".*data.train_batch_size=480"):
        check_split(510, 51, 5, 3, workers=8)
    with pytest.raises(ValueError, match="2700 trajectories"):
        check_split(540, 54, 5, 6, workers=8)
    assert ten_update_geometry(3) == (480, 48) and ten_update_geometry(6) == (480, 48)
    for ranks in range(1, 33):
        train, mini = ten_update_geometry(ranks)
        check_split(train, mini, 5, ranks, workers=8)
        assert train // mini == 10


def test_train_main_checks_the_agent_worker_split_of_a_preset():
    from train.trainer.config_checks import check_config

    cfg = load("grpo", ["trainer.n_gpus_per_node=3", "data.train_batch_size=510",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=51"])
    with pytest.raises(ValueError, match="agent workers"):
        check_config(cfg)


def test_a_replica_per_node_needs_agent_workers_on_every_node(tmp_path):
    """verl places its agent workers round-robin over the nodes and each searches its own node's replica:
    16 nodes with the default 8 workers would leave 8 replicas without a search."""
    from train.trainer.config_checks import check_config

    url = "search_r1.retriever_url='http://{node_ip}:8000/retrieve'"
    nodes = ["trainer.nnodes=16", "trainer.n_gpus_per_node=8", f"trainer.default_local_dir={tmp_path}",
             "data.train_batch_size=1280", "actor_rollout_ref.actor.ppo_mini_batch_size=128"]  # 128 ranks
    cfg = load("grpo", [*nodes, url])
    with pytest.raises(ValueError, match="replica on each of trainer.nnodes=16 nodes, but "
                                         "actor_rollout_ref.rollout.agent.num_workers=8 agent workers run "
                                         "rollouts on 8 of them.*multiple of 16"):
        check_config(cfg)
    # one head retriever: the worker count is not its concern; enough workers: accepted
    check_config(load("grpo", nodes))
    check_config(load("grpo", [*nodes, url, "actor_rollout_ref.rollout.agent.num_workers=16"]))


def test_a_train_file_smaller_than_one_batch(tmp_path):
    from tests.trainer.test_faults_on_cpu import parquet_with_golds

    path = parquet_with_golds(tmp_path / "train.parquet", [["a"]] * 100)
    cfg = load("grpo", [f"data.train_files={path}", f"data.val_files={path}"])
    with pytest.raises(ValueError, match="hold 100 rows, fewer than one batch \\(data.train_batch_size=520\\)"):
        preflight.data_preflight(cfg, log=lambda m: None)
    cfg = load("grpo", [f"data.train_files={path}", f"data.val_files={path}", "data.train_batch_size=100",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=10"])
    preflight.data_preflight(cfg, log=lambda m: None)


def test_fsdp1_on_cpu_and_missing_models_are_refused(tmp_path):
    assert load("grpo").actor_rollout_ref.actor.strategy == "fsdp2"  # the presets' (CPU and GPU alike)
    cfg = load("grpo", ["actor_rollout_ref.actor.strategy=fsdp"])  # a user's FSDP1 override, on CPU
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp"
    with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy=fsdp \\(FSDP1\\) cannot run on CPU"):
        preflight.strategy_preflight(cfg, cpu=True)
    preflight.strategy_preflight(cfg, cpu=False)
    preflight.strategy_preflight(load("cpu_smoke"), cpu=True)
    for path in (tmp_path / "nope", "./runs/no_model", "runs/a/b/no_model"):
        bad = load("grpo", [f"actor_rollout_ref.model.path={path}"])
        with pytest.raises(ValueError, match="does not exist"):
            preflight.model_preflight(bad)
    preflight.model_preflight(load("grpo", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct"]))  # a hub id
    ppo = load("ppo", [f"actor_rollout_ref.model.path={tmp_path}", f"critic.model.path={tmp_path / 'gone'}"])
    with pytest.raises(ValueError, match="critic.model.path="):
        preflight.model_preflight(ppo)


def test_more_ranks_than_the_cluster_has_gpus():
    """The trainer would wait forever ("No available node types can fulfill resource request")."""
    cfg = load("grpo", ["trainer.n_gpus_per_node=4", "trainer.nnodes=2"])
    node = lambda gpus, cpus=64: {"Alive": True, "Resources": {"GPU": gpus, "CPU": cpus}}  # noqa: E731
    with pytest.raises(ValueError, match="= 8 GPUs asked for, but the Ray cluster has 4 \\(GPUs per node: \\[4\\]\\)"):
        preflight.ray_resources_preflight(cfg, {"GPU": 4.0}, [node(4)])
    with pytest.raises(ValueError, match="GPUs per node: \\[6, 2\\]"):  # enough in all, but not 4 on each of 2 nodes
        preflight.ray_resources_preflight(cfg, {"GPU": 8.0}, [node(6), node(2)])
    preflight.ray_resources_preflight(cfg, {"GPU": 8.0}, [node(4), node(4)])
    with pytest.raises(ValueError, match="needs 12 CPUs on each of 2 nodes .*CPUs per node: \\[12, 2\\]"):
        preflight.ray_resources_preflight(cfg, {"GPU": 8.0}, [node(4, 12), node(4, 2)])  # verl: 3 CPUs per GPU


@pytest.mark.slow
def test_train_main_names_the_problem_before_ray(tmp_path, tiny_model_dir, qa_path):
    from train.data_prep import main as prep

    prep(["--out", str(tmp_path / "data"), "--local", str(qa_path), "--holdout", "5"])
    base = [sys.executable, "-m", "train.main", "--config-name", "cpu_smoke",
            f"data.train_files={tmp_path / 'data/train.parquet'}", f"data.val_files={tmp_path / 'data/test.parquet'}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    env = {**os.environ, "VERL_PLATFORM": "cpu"}
    for extra, message in (([f"actor_rollout_ref.model.path={tmp_path / 'no_model'}"], "no_model does not exist"),
                           ([f"actor_rollout_ref.model.path={tiny_model_dir}", "data.train_batch_size=1000",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=500"], "fewer than one batch")):
        t0 = time.monotonic()
        r = subprocess.run([*base, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr, r.stderr[-3000:]
        assert "ray: starting" not in r.stdout and time.monotonic() - t0 < 120


def test_the_demo_prints_each_step_as_it_is_trained():
    """`make demo` pipes the trainer's output through `step_metrics.py --live` (7 minutes of silence before)."""
    import io

    sys.path.insert(0, str(ROOT / "scripts"))
    from step_metrics import live

    log = ["(TaskRunner pid=1) Training Progress:   0%|",
           "(TaskRunner pid=1) step:1 - critic/score/mean:0.203 - search_r1/searches:1.0 - actor/llds/penalty:0.0012"
           " - actor/llds/gated_action_frac:0.31 - search_r1/warning:0.0",
           "some other line",
           "(TaskRunner pid=1) collapse warning: ALARM at step 2: probe 0.42, ratio 0.031 (thresholds: ...)",
           "(TaskRunner pid=1) step:2 - critic/score/mean:np.float64(0.5) - search_r1/searches:0.97 - "
           "val-core/nq/reward/mean@1:0.8 - val-core/hotpotqa/reward/mean@1:0.6 - search_r1/warning:2.0"]
    ticks = iter([0.0, 61.0, 125.0])
    out = io.StringIO()
    live(iter(log), total=30, out=out, clock=lambda: next(ticks))
    assert out.getvalue().splitlines() == [
        "step 1/30  reward 0.20  searches 1.00  LLDS penalty 0.0012  gated 0.31  elapsed 1m01s",
        "collapse warning: ALARM at step 2: probe 0.42, ratio 0.031 (thresholds: ...)",
        "step 2/30  reward 0.50  searches 0.97  val EM 0.70  COLLAPSE ALARM  elapsed 2m05s"]
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert 'tee "$RUN/train.log"' in demo and "step_metrics.py --live" in demo


def test_checkpoint_check_command_and_a_partial_table(tmp_path):
    """reproduce_paper.sh trains unless `python -m train.checkpoints DIR/global_step_N` says it is
    complete (it skipped training for any existing folder); a table over fewer sources than the paper's
    row does not print the paper's 7-source average beside its own."""
    from tests.trainer.test_faults_on_cpu import fake_checkpoint, truncate
    from train.evaluation.report import paper_row, table

    folder = fake_checkpoint(tmp_path, 650)
    cmd = [sys.executable, "-m", "train.checkpoints", str(folder)]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0
    truncate(folder / "data.pt")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and "data.pt has 100 bytes" in r.stdout
    paper = paper_row("3B-Ins GRPO+LLDS")
    rows = [{"data_source": "nq", "em": 1.0, "f1": 1.0}, {"data_source": "hotpotqa", "em": 0.0, "f1": 0.0}]
    text = table(rows, paper)
    mean2 = (paper["nq"] + paper["hotpotqa"]) / 2
    assert f"{mean2:.3f}" in text.splitlines()[3] and f"{paper['avg']:.3f}" not in text.splitlines()[3]
    assert "over 2 of the paper's 7 sources" in text


def test_save_on_sigterm_must_be_a_boolean(tiny_model_dir):
    from train.trainer.config_checks import check_config

    cfg = load("cpu_smoke", [f"actor_rollout_ref.model.path={tiny_model_dir}", "+trainer.save_on_sigterm=sometimes"])
    with pytest.raises(ValueError, match="trainer.save_on_sigterm must be true or false, got 'sometimes'"):
        check_config(cfg)
    check_config(load("cpu_smoke", [f"actor_rollout_ref.model.path={tiny_model_dir}", "+trainer.save_on_sigterm=true"]))
