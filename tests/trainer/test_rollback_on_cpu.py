"""``collapse_warning.action=rollback`` on files, without training: the target is the newest complete
checkpoint before the warning began, the checkpoints after it and the metrics are set aside (never
deleted), the config resumes the target's weights with the learning rate scaled, and an alarm with no
rollback left stops the run (exit 5). The live run: tests/toy/test_collapse_warning_on_cpu.py."""

import json

import pytest
from omegaconf import OmegaConf

from tests.trainer.test_faults_on_cpu import fake_checkpoint
from train.errors import CollapseStopped
from train.monitor.detectors import WarningConfig
from train.trainer import checkpoint_store
from train.trainer.launch import roll_back
from train.trainer.rollback import Stop, keep_for_rollback, set_aside, target_step


def _metrics(path, steps):
    path.write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": s / 10}}) + "\n" for s in steps))


def _config(root, action="rollback", **warning):
    return OmegaConf.create({
        "collapse_warning": {"action": action, **warning},
        "actor_rollout_ref": {"actor": {"optim": {"lr": 1e-3}, "checkpoint": {"load_contents": ["model", "optimizer",
                                                                                                  "extra"]}}},
        "trainer": {"logger": ["console", "file"], "resume_mode": "auto", "resume_from_path": None,
                    "default_local_dir": str(root)}})


def test_the_stop_record_round_trips_and_is_consumed(tmp_path):
    path = tmp_path / ".collapse_stop"
    assert Stop.read(str(path)) is None
    path.write_text(Stop("ALARM at step 6: ratio 0.2", 6, 4).to_json())
    assert Stop.read(str(path)) == Stop("ALARM at step 6: ratio 0.2", 6, 4)
    assert not path.exists()
    path.write_text("the collapse warning stopped the run at step 3\n")  # plain text: its text, no steps
    assert Stop.read(str(path)) == Stop("the collapse warning stopped the run at step 3", -1, None)


def test_the_target_is_the_newest_complete_checkpoint_before_the_warning_began(tmp_path):
    for s in (2, 4, 5, 6):
        fake_checkpoint(tmp_path, s)
    assert target_step(str(tmp_path), 6) == 5
    assert target_step(str(tmp_path), 5) == 4  # the step the warning began at already holds its update
    assert target_step(str(tmp_path), 3) == 2
    assert target_step(str(tmp_path), 2) == 0  # none before: the model the run started from
    assert target_step(str(tmp_path), None) == 0
    (tmp_path / "global_step_4" / "data.pt").unlink()  # incomplete: skipped
    checkpoint_store.write_manifest(str(tmp_path / "global_step_5"))
    (tmp_path / "global_step_5" / "data.pt").write_bytes(b"torn")
    assert target_step(str(tmp_path), 6) == 2
    assert keep_for_rollback(str(tmp_path), 6) == [2] and keep_for_rollback(str(tmp_path), None) == []


def test_pruning_keeps_the_rollback_target_while_a_warning_is_open(tmp_path):
    for s in range(1, 7):
        fake_checkpoint(tmp_path, s)
    removed = checkpoint_store.prune(str(tmp_path), 3, keep_for_rollback(str(tmp_path), 4))
    assert removed == [1, 2] and checkpoint_store.saved_steps(str(tmp_path)) == [3, 4, 5, 6]


def test_set_aside_moves_the_later_checkpoints_and_copies_the_metrics(tmp_path):
    for s in (2, 4, 5, 6):
        fake_checkpoint(tmp_path, s)
    metrics = tmp_path / "metrics.jsonl"
    _metrics(metrics, range(1, 7))
    plan = set_aside(str(tmp_path), Stop("ALARM at step 6", 6, 5), 1, str(metrics), 1e-3, 0.5)
    assert (plan.target, plan.moved, plan.lr) == (4, (5, 6), 5e-4)
    assert checkpoint_store.saved_steps(str(tmp_path)) == [2, 4]
    assert sorted(p.name for p in (tmp_path / "rolled_back_1").iterdir()) == ["global_step_5", "global_step_6"]
    assert checkpoint_store.read_tracker(str(tmp_path)) == (4, None)
    assert metrics.read_text() == (tmp_path / "metrics.jsonl.rolled_back_1").read_text()  # the file itself is
    # cut back to step 4 by prepare_run (metrics_file.keep_until), as on any resume


def test_set_aside_to_the_start(tmp_path):
    fake_checkpoint(tmp_path, 3)
    metrics = tmp_path / "metrics.jsonl"
    _metrics(metrics, range(1, 4))
    plan = set_aside(str(tmp_path), Stop("ALARM at step 3", 3, 2), 2, str(metrics), 1e-3, 0.25)
    assert (plan.target, plan.moved, plan.lr) == (0, (3,), 2.5e-4)
    assert checkpoint_store.saved_steps(str(tmp_path)) == [] and checkpoint_store.read_tracker(str(tmp_path))[0] is None
    assert (tmp_path / "rolled_back_2" / checkpoint_store.TRACKER).read_text() == "3"
    assert not metrics.exists() and len((tmp_path / "metrics.jsonl.rolled_back_2").read_text().splitlines()) == 3


def test_roll_back_points_the_config_at_the_target(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    for s in (1, 2, 3):
        fake_checkpoint(tmp_path, s)
    _metrics(tmp_path / "metrics.jsonl", [1, 2, 3])
    config = _config(tmp_path, rollback_lr_scale=0.5, max_rollbacks=2)
    roll_back(config, str(tmp_path), Stop("ALARM at step 3: probe 0.9", 3, 3), 1)
    actor = config.actor_rollout_ref.actor
    assert actor.optim.lr == pytest.approx(5e-4) and list(actor.checkpoint.load_contents) == ["model"]
    assert config.trainer.resume_mode == "resume_path"
    assert config.trainer.resume_from_path == checkpoint_store.step_dir(str(tmp_path), 2)
    out = capsys.readouterr().out
    assert "rolling back (1 of collapse_warning.max_rollbacks=2)" in out and "0.001 x 0.5 = 0.0005" in out
    assert (tmp_path / "metrics.jsonl.rolled_back_1").is_file()
    roll_back(config, str(tmp_path), Stop("ALARM at step 2", 2, 1), 2)  # the second: back to the start
    assert config.trainer.resume_mode == "disable" and actor.optim.lr == pytest.approx(2.5e-4)
    with pytest.raises(CollapseStopped, match=r"ALARM at step 4; after 2 rollback\(s\) "
                                              r"\(collapse_warning.max_rollbacks=2\)"):
        roll_back(config, str(tmp_path), Stop("ALARM at step 4", 4, 3), 3)
    assert CollapseStopped.exit_code == 5


def test_stop_and_warn_never_roll_back(tmp_path):
    fake_checkpoint(tmp_path, 1)
    config = _config(tmp_path, action="stop")
    with pytest.raises(CollapseStopped, match="^ALARM at step 2$"):
        roll_back(config, str(tmp_path), Stop("ALARM at step 2", 2, 2), 1)
    assert checkpoint_store.saved_steps(str(tmp_path)) == [1] and config.actor_rollout_ref.actor.optim.lr == 1e-3


@pytest.mark.parametrize("block, error", [
    ({"action": "rewind"}, "collapse_warning.action must be one of warn, stop, rollback"),
    ({"rollback_lr_scale": 0}, r"rollback_lr_scale must be a number in \(0, 1\]"),
    ({"rollback_lr_scale": 2.0}, r"rollback_lr_scale must be a number in \(0, 1\]"),
    ({"rollback_lr_scale": True}, r"rollback_lr_scale must be a number"),
    ({"max_rollbacks": -1}, "max_rollbacks must be an integer >= 0"),
    ({"max_rollbacks": 1.5}, "max_rollbacks must be an integer >= 0"),
])
def test_bad_rollback_settings_are_named(block, error):
    with pytest.raises(ValueError, match=error):
        WarningConfig.from_dict(block)
    cfg = WarningConfig.from_dict({"action": "rollback", "rollback_lr_scale": 0.25, "max_rollbacks": 1})
    assert (cfg.action, cfg.rollback_lr_scale, cfg.max_rollbacks) == ("rollback", 0.25, 1)


def test_the_probe_is_restored_and_its_reference_kept_only_on_its_own_branch(tmp_path):
    """A rollback keeps the probe's rows; their reference stays when the run resumes at or after the step
    it was scored at, and is scored again after a rollback to before it."""
    import types

    import torch

    from train.trainer.probe import DisplacementProbe

    rows = types.SimpleNamespace(batch={"response_mask": torch.ones(2, 3),
                                        "answer_mask": torch.tensor([[0, 1, 1]] * 2)})
    probe = DisplacementProbe(2)
    probe.data, probe.held = rows, 2
    first = probe.score(torch.full((2, 3), -1.0), step=3)
    assert first["probe/drop"] == 0.0 and probe.reference_step == 3
    path = str(tmp_path / "ckpt" / "collapse_probe.pt")  # the folder does not exist before the first save
    probe.save(path)
    same = DisplacementProbe(2)
    assert same.restore(path, resumed_at=5) and same.held == 2 and same.reference_step == 3
    assert same.score(torch.full((2, 3), -1.5), step=6)["probe/drop"] == pytest.approx(0.5)
    before = DisplacementProbe(2)
    assert before.restore(path, resumed_at=2) and before.reference == {} and before.held == 2
    assert before.score(torch.full((2, 3), -1.5), step=3)["probe/drop"] == 0.0  # counted from this branch
    assert not DisplacementProbe(4).restore(path, resumed_at=5)  # another probe size: built anew
    assert not DisplacementProbe(2).restore(str(tmp_path / "none.pt"), resumed_at=5)


@pytest.mark.parametrize("argv", [["--rollback-lr-scale", "0.2"], ["--rollback", "--rollback-lr-scale", "0"],
                                  ["--rollback", "--rollback-lr-scale", "1.5"]])
def test_the_rollback_benchmark_refuses_a_bad_scale(argv, capsys):
    from bench.collapse_corpus import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "--rollback-lr-scale needs --rollback and a value in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize("last_step", [True, False])
def test_an_alarm_stops_the_run_even_on_its_last_step(tmp_path, monkeypatch, last_step):
    """The stop is raised where verl's loop starts a step; after the last step there is none, so an ALARM on the
    last step must stop the run from ``fit`` itself (before this, such a run ended with exit 0 and no rollback)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from train.monitor.detectors import Decision, Level
    from train.trainer.ray_trainer import SearchR1Trainer
    from train.trainer.sigterm import COLLAPSE_FLAG

    def fit(self):  # verl's loop: the ALARM at step 12, saved; on the last step nothing starts a 13th step
        self._alarm_stop, self._alarm_began, self._saved_step = Decision(12, Level.ALARM, ("probe",),
                                                                         (("probe", 1.05),)), 9, 12
        if not last_step:
            self._start_profiling(False)

    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    trainer = SearchR1Trainer.__new__(SearchR1Trainer)
    trainer.config = _config(tmp_path)
    trainer._init_dump_executor()  # verl's __init__ does this; the stop drains it
    trainer.fit()
    stop = Stop.read(str(tmp_path / COLLAPSE_FLAG))
    assert stop is not None and (stop.step, stop.began) == (12, 9)
    assert "ALARM at step 12: probe 1.05" in stop.text and "saved as global_step_12" in stop.text


@pytest.mark.parametrize("skip_update", [True, False])
def test_a_step_with_no_advantage_skips_the_update_when_asked(tmp_path, monkeypatch, capsys, skip_update):
    """flat_steps.skip_update: a step whose every advantage is 0 (all groups flat) makes no optimizer step; a step
    with one nonzero advantage trains; off (the default), every step trains, as in verl."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from train.trainer import ray_trainer
    from train.trainer.ray_trainer import UPDATE_SKIPPED, SearchR1Trainer, no_learning_signal

    updates = []

    def update(self, batch):  # verl's update: one optimizer pass, its metrics
        updates.append(self.global_steps)
        return DataProto.from_single_dict(data={}, meta_info={"metrics": {"actor/pg_loss": [0.1]}})

    monkeypatch.setattr(RayPPOTrainer, "_update_actor", update)
    for name in ("search_metrics", "behaviour_metrics"):  # read the rollout's fields, not what this test is about
        monkeypatch.setattr(ray_trainer, name, lambda batch: {})
    monkeypatch.setattr(SearchR1Trainer, "_probe_displacement", lambda self, batch: {})
    trainer = SearchR1Trainer.__new__(SearchR1Trainer)
    trainer.config = OmegaConf.merge(_config(tmp_path, action="warn", enable=False),
                                     {"flat_steps": {"skip_update": skip_update}})
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]])
    flat = DataProto.from_single_dict({"advantages": torch.zeros(4, 3), "response_mask": mask})
    # a nonzero advantage on a padding token is no signal; on a response token it is
    padded = DataProto.from_single_dict({"advantages": torch.tensor([[0, 0, 0.5], *[[0.0] * 3] * 3]),
                                         "response_mask": mask})
    signal = DataProto.from_single_dict({"advantages": torch.tensor([[0, 0, 0], [0, 0, -0.7], *[[0.0] * 3] * 2]),
                                         "response_mask": mask})
    assert no_learning_signal(flat) and no_learning_signal(padded) and not no_learning_signal(signal)
    logged = {}
    for step, batch in ((1, flat), (2, signal), (3, padded)):
        trainer.global_steps = step
        logged[step] = trainer._update_actor_with_metrics(batch).meta_info["metrics"][UPDATE_SKIPPED]
    assert updates == ([2] if skip_update else [1, 2, 3])
    assert logged == ({1: [1.0], 2: [0.0], 3: [1.0]} if skip_update else {1: [0.0], 2: [0.0], 3: [0.0]})
    said = capsys.readouterr().out
    assert ("step 1: every advantage is 0" in said) == skip_update and "step 2: every advantage" not in said
