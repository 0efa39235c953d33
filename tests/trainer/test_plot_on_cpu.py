"""python -m train.plot: PNGs from a verl file-logger metrics file."""

import json
import re

import pytest

from train import plot


def write_run(path, steps=12, alarm_at=(9,), seed=0.0, watch_at=(6,)):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "data": {"val-core/facts/reward/mean@1": 0.1}}) + "\n")
        for s in range(1, steps + 1):
            data = {"critic/score/mean": 0.3 + 0.04 * s + seed, "search_r1/searches": 1.0,
                    "search_r1/valid_searches": 1.0, "search_r1/answered": 0.9, "response_length/mean": 120.0,
                    "actor/llds/penalty": 0.01, "actor/llds/gated_action_frac": 0.4,
                    "actor/llds/gated_response_frac": 0.5, "actor/llds/logp_pos_a1": -0.5 + 0.02 * s,
                    "actor/llds/logp_pos_a2": -0.9 + 0.03 * s, "actor/llds/logp_pos_a3": 0.0,
                    "actor/llds/logp_pos_answer": -1.2 + 0.05 * s, "actor/llds/logp_pos": -0.8 + 0.03 * s,
                    "search_r1/warning": 2.0 if s in alarm_at else 1.0 if s in watch_at else 0.0,
                    "search_r1/signal/probe": 0.05 * s, "search_r1/signal/format": 0.0,
                    "search_r1/signal_level/probe": 2.0 if s in alarm_at else 0.0,
                    "search_r1/signal_level/format": 1.0 if s in watch_at else 0.0,
                    "training/global_step": s, "some/text": "not a number"}
            f.write(json.dumps({"step": s, "data": data}) + "\n")
            if s % 5 == 0:
                f.write(json.dumps({"step": s, "data": {"val-core/facts/reward/mean@1": 0.1 + 0.05 * s}}) + "\n")
    return path


def test_reads_and_merges_lines_of_a_step(tmp_path):
    steps = plot.read_metrics(write_run(tmp_path / "run"))
    assert sorted(steps)[:2] == [0, 1] and max(steps) == 12
    assert steps[5]["critic/score/mean"] == pytest.approx(0.5) and steps[5]["val-core/facts/reward/mean@1"] == 0.35
    assert "some/text" not in steps[5]
    from train.trainer.plots import series

    assert series(steps, "val-core/facts/reward/mean@1") == ([0, 5, 10], [0.1, 0.35, 0.6])


def test_writes_the_pngs_with_the_listed_series(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = {}
    real_savefig = matplotlib.figure.Figure.savefig

    def spy(fig, path, *a, **k):  # record what each PNG shows, then write it for real
        drawn[path.name] = {ax.get_title(): [line.get_label() for line in ax.get_lines()] for ax in fig.axes}
        drawn[path.name]["_ylabels"] = [ax.get_ylabel() for ax in fig.axes]
        return real_savefig(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    run = write_run(tmp_path / "run")
    paths = plot.plot_runs([plot.read_metrics(run)], ["run"], run / "plots")
    assert [p.name for p in paths] == ["reward.png", "search.png", "llds.png", "lld.png", "warning.png"]
    for p in paths:
        assert p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG"
    assert drawn["reward.png"]["training reward per step"] == ["reward (mean over trajectories)"]
    assert drawn["reward.png"]["validation EM (held-out questions)"] == ["facts EM"]
    assert "searches / trajectory" in drawn["search.png"]["searches and answers"]
    assert drawn["llds.png"]["LLDS gate"] == ["actions gated open", "responses gated open"]
    lld = next(v for k, v in drawn["lld.png"].items() if k.startswith("LLD diagnostic"))
    # a3 is all zeros (no third action in this run): left out; the WATCH and ALARM steps are marked apart
    labels = [x for x in lld if not x.startswith("_")]
    assert labels == ["action 1", "action 2", "answer span", "WATCH", "ALARM"]
    likelihood = drawn["warning.png"]["collapse warning: likelihood and update signals"]
    assert [x for x in likelihood if not x.startswith("_")] == ["probe", "WATCH", "ALARM"]
    from train.trainer.plots import warning_steps

    assert warning_steps(plot.read_metrics(run)) == [(6, 1, ["format"]), (9, 2, ["probe"])]
    assert all(label for label in drawn["lld.png"]["_ylabels"])
    plt.close("all")


def test_compare_two_runs_cli(tmp_path, capsys):
    a, b = write_run(tmp_path / "on"), write_run(tmp_path / "off", alarm_at=(), seed=-0.1)
    plot.main([str(a), str(b), "--labels", "LLDS on", "LLDS off", "--out", str(tmp_path / "cmp")])
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "cmp" / n) for n in ("reward.png", "search.png", "llds.png", "lld.png",
                                                           "warning.png")]


def test_errors_name_the_file_and_line(tmp_path, capsys):
    from tests.conftest import refuses

    refuses(plot.main, [str(tmp_path)], capsys, "no metrics file", code=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "data": {}}\nnot json\n')
    # a line that is not a whole row (a run killed while writing) is skipped, naming the file and line
    assert plot.main([str(tmp_path)]) in (0, None)
    assert re.search(r"metrics.jsonl: skipped 1 line\(s\) .*\(line 2;", capsys.readouterr().err)
    refuses(plot.main, [str(tmp_path), str(tmp_path)], capsys, "--out")  # two runs need --out
