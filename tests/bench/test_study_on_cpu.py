"""bench/study.py's report from recorded runs: collapse shares from the labels, final rewards, the difference
against GRPO paired by seed with an interval over seeds, the curves; a missing run is left out, not guessed."""

import json

import pytest

import bench.study as study
from bench.collapse_corpus import record, run_file


def write(corpus, variant, seed, rewards):
    metrics = {s: {"critic/score/mean": r, "actor/entropy": 0.5, "probe/logp": -0.1 * s, "search_r1/searches": 1.0}
               for s, r in enumerate(rewards, 1)}
    header = {"model": "toy", "variant": variant, "seed": seed, "steps": len(rewards), "fault": False}
    record(metrics, header, run_file(corpus, variant, seed))


def test_the_report_pairs_arms_by_seed_and_counts_collapses(tmp_path, capsys):
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    healthy = [0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    collapsed = [0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    for seed in (0, 1, 2):
        write(corpus, "grpo", seed, [r + 0.01 * seed for r in healthy])
        write(corpus, "llds", seed, [r + 0.01 * seed + 0.1 for r in healthy])  # 0.1 above GRPO on every seed
        write(corpus, "grpo_updates8", seed, collapsed)
    write(corpus, "llds_updates8", 0, healthy)  # one seed only: no interval, no pairing beyond it
    study.main(["--corpus", str(corpus), "--out", str(out), "--seeds", "0", "1", "2"])
    summary = json.loads((out / "toy.json").read_text())
    preset, collapse = summary["preset"], summary["updates8"]
    assert set(preset) == {"grpo", "llds"} and set(collapse) == {"grpo", "llds"}
    assert preset["llds"]["vs_grpo"]["diff"] == pytest.approx(0.1)
    lo, hi = preset["llds"]["vs_grpo"]["ci95"]
    assert lo == pytest.approx(0.1) and hi == pytest.approx(0.1)  # the same gap on every seed
    assert preset["grpo"]["final_reward"] == pytest.approx(0.61)
    assert (preset["grpo"]["collapsed"], collapse["grpo"]["collapsed"]) == (0, 3)
    assert collapse["grpo"]["onsets"] == [3, 3, 3]  # the smoothed reward is below half its peak from step 3
    assert collapse["llds"]["seeds"] == [0] and "vs_grpo" not in collapse["llds"]
    assert (out / "toy.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "| GRPO+LLDS | 3 | 0/3 | 0.710 [0.700, 0.720] | +0.100 [+0.100, +0.100] |" in printed
    assert "| GRPO | 3 | 3/3 (3, 3, 3) | 0.000 [0.000, 0.000] | - |" in printed


def test_no_recorded_run_says_how_to_make_them(tmp_path):
    with pytest.raises(SystemExit, match="bench/study.py --run"):
        study.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "out")])
