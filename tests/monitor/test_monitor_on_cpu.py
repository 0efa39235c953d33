"""The collapse warning's parts on synthetic records: the label from outcomes, the signals, the warning,
the scores (train/monitor/)."""

import json
import math

import pytest

from train.monitor import detectors as d
from train.monitor.labels import label
from train.monitor.records import Run, keep, read_corpus
from train.monitor.scoring import Score, fit, score


def run(rewards, name="toy/r", fault=False, **series):
    steps = []
    for i, r in enumerate(rewards):
        row = {"step": i + 1, "critic/score/mean": r, "search_r1/adv_token_share": 1.0, "actor/grad_norm": 1.0}
        for k, vals in series.items():
            row[k.replace("__", "/")] = vals[i]
        steps.append(row)
    return Run(name, {"model": "toy", "seed": 0, "fault": fault}, steps)


def test_the_label_reads_only_outcomes():
    assert label(run([0.4, 0.5, 0.6, 0.7, 0.7, 0.8])).kind == "healthy"
    # falls from 0.8 and stays low: onset = the first step the smoothed reward is below half its peak
    lab = label(run([0.6, 0.8, 0.8, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]))
    assert (lab.kind, lab.onset) == ("collapse", 5), lab  # ema: .6 .7 .75 .425 .2125 < .375
    dip = label(run([0.6, 0.8, 0.8, 0.0, 0.0, 0.8, 0.8, 0.8, 0.8, 0.8]))
    assert dip.kind == "transient" and dip.transients == (5,), dip
    assert label(run([0.6, 0.8, 0.8, 0.1, 0.0, 0.0])).kind == "censored"  # not 5 steps seen yet
    assert label(run([0.04, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])).kind == "healthy"  # never a peak of 0.05 (MIN_PEAK)
    nan = run([0.5, 0.5, 0.5])
    nan.steps[1]["actor/pg_loss"] = math.nan
    assert (label(nan).kind, label(nan).onset) == ("collapse", 2)
    crashed = Run("toy/c", {"crashed": True, "error": "ValueError: loss is nan"}, run([0.5, 0.5]).steps)
    assert (label(crashed).kind, label(crashed).onset) == ("collapse", 3)


def test_a_step_without_learning_signal_moves_no_baseline_and_fires_nothing():
    """The update-size signal: grad_norm / adv_token_share over its median on steps that carried a signal.
    A zero-advantage step (tiny grad_norm from KL and entropy alone) is skipped: the next ordinary step is not
    a spike (today's alarm fired on exactly this: SmolLM2 step 9, 79x)."""
    warning = d.CollapseWarning(d.Thresholds({"update": (3.0, 5.0)}))
    rows = [{"actor/grad_norm": 1.0, "search_r1/adv_token_share": 0.5}] * 3 + \
           [{"actor/grad_norm": 0.001, "search_r1/adv_token_share": 0.0}] * 3 + \
           [{"actor/grad_norm": 1.1, "search_r1/adv_token_share": 0.5}]
    levels = [warning.update(i + 1, r).level for i, r in enumerate(rows)]
    assert levels == [d.Level.OK] * 7
    assert warning.state.update_sizes == [2.0, 2.0, 2.0, 2.2]
    assert warning.update(8, {"actor/grad_norm": 6.0, "search_r1/adv_token_share": 0.5}).level == d.Level.ALARM


def test_behaviour_is_measured_against_step_one():
    th = d.Thresholds({"format": (0.2, 0.5), "entropy": (0.5, 1.0)}, watch_votes=2)
    w = d.CollapseWarning(th)
    base = {"search_r1/valid_format": 0.9, "search_r1/sample_nll": 0.1}
    assert w.update(1, base).level == d.Level.OK
    assert w.state.reference["search_r1/valid_format"] == 0.9
    watch = w.update(2, {"search_r1/valid_format": 0.6, "search_r1/sample_nll": 0.1})  # format fell 0.3
    assert (watch.level, watch.signals) == (d.Level.WATCH, ("format",))
    both = w.update(3, {"search_r1/valid_format": 0.6, "search_r1/sample_nll": 0.17})  # + entropy |ln 1.7| = 0.53
    assert both.level == d.Level.ALARM and set(both.signals) == {"format", "entropy"}  # two WATCHes: ALARM
    assert "format 0.3" in both.describe() and "ALARM at step 3" in both.describe()


def test_the_scores_by_hand():
    """3 runs: a collapse at step 6 caught at step 4 (lead 2), a collapse missed, a healthy run with one
    alarm in 10 steps."""
    caught = run([0.6, 0.8, 0.8, 0.8, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0], "toy/a",
                 probe__drop=[0, 0, 0, .9, .9, .9, .9, .9, .9, .9])
    missed = run([0.6, 0.8, 0.8, 0.8, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0], "toy/b", probe__drop=[0] * 10)
    healthy = run([0.5] * 10, "toy/c", probe__drop=[0, 0, 0, 0, .9, 0, 0, 0, 0, 0])
    runs = [caught, missed, healthy]
    labels = {r.name: label(r) for r in runs}
    assert [labels[r.name].onset for r in runs] == [6, 6, None]
    th = d.Thresholds({"probe": (0.5, 0.8)})
    s = score(lambda: d.CollapseWarning(th), runs, labels)
    assert (s.collapses, s.hits, s.leads, s.missed) == (2, 1, [2], ["toy/b"])
    assert (s.healthy_steps, s.false_alarm_steps, s.false_alarms_per_100) == (10, 1, 10.0)
    assert (s.healthy_runs_alarmed, s.healthy_runs, s.precision) == (1, 1, 0.5)


def test_fitting_never_alarms_on_what_it_was_fitted_on():
    collapsing = [run([0.6, 0.8, 0.8, 0.8, 0.2, 0.0, 0.0, 0.0, 0.0, 0.0], f"toy/c{i}",
                      probe__drop=[0, 0, .1, .6, .9, 1, 1, 1, 1, 1]) for i in range(2)]
    healthy = [run([0.5] * 10, f"toy/h{i}", probe__drop=[0, .1, .2, .1, 0, 0, .3, 0, 0, 0]) for i in range(2)]
    runs = collapsing + healthy
    labels = {r.name: label(r) for r in runs}
    th = fit(runs, labels, signals=("probe", "ratio"))
    assert set(th.levels) == {"probe"}  # ratio: never logged, so not kept
    assert th.levels["probe"] == pytest.approx((0.3, 0.45))  # WATCH: the healthy maximum 0.3; ALARM 1.5 x it
    s = score(lambda: d.CollapseWarning(th), runs, labels)
    assert s.false_alarm_steps == 0 and s.hits == 2 and s.leads == [2, 2]


def test_records_keep_fixed_keys_and_the_reader_names_bad_lines(tmp_path):
    kept = keep({"critic/score/mean": 0.5, "actor/llds/ratio_low_share": 0.1, "probe/drop": math.nan,
                 "timing_per_token_ms/gen": 3.0, "search_r1/valid_format": "x"})
    assert set(kept) == {"critic/score/mean", "actor/llds/ratio_low_share", "probe/drop"}
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"run": {"model": "toy", "seed": 1}}) + "\n" + json.dumps({"step": 1, "x": 1.0}) + "\n")
    assert read_corpus(tmp_path)[0].name == "toy/a"
    (tmp_path / "b.jsonl").write_text('{"run": {}}\n{"step": 1\n')
    from train.errors import DataError

    with pytest.raises(DataError, match=r"b.jsonl:2: not JSON"):
        read_corpus(tmp_path)


def test_the_warning_config_is_checked():
    cfg = d.WarningConfig.from_dict({"action": "stop", "levels": {"probe": [0.1, 0.2]}, "watch_votes": 3})
    assert cfg.action == "stop" and cfg.thresholds.levels == {"probe": (0.1, 0.2)} and cfg.thresholds.watch_votes == 3
    for bad, named in (({"levels": {"reward": [0, 1]}}, "unknown signal 'reward'"),
                       ({"action": "rewind"}, "must be one of warn, stop, rollback"),
                       ({"probe_rows": -1}, "probe_rows")):
        with pytest.raises(ValueError, match=named):
            d.WarningConfig.from_dict(bad)


def test_score_add():
    a, b = Score(collapses=1, hits=1, leads=[2]), Score(collapses=2, leads=[3])
    assert (a.add(b).collapses, a.add(b).leads) == (3, [2, 3])
