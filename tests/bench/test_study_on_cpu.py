"""bench/study.py's report from recorded runs: collapse shares from the labels, final rewards, the difference
against GRPO paired by seed with an interval over seeds, the curves; a missing run is left out, not guessed."""

import json

import pytest

import bench.study as study
from bench.collapse_corpus import record, run_file


def write(corpus, variant, seed, rewards):
    metrics = {s: {"critic/score/mean": r, "actor/entropy": 0.5, "probe/logp": -0.1 * s, "search_r1/searches": 1.0,
                   "search_r1/valid_format": 1.0 if r > 0 else 0.25} for s, r in enumerate(rewards, 1)}
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
    assert "| GRPO+LLDS | 3 | 0/3 | 0.710 [0.700, 0.720] | 1.00 | +0.100 [+0.100, +0.100] |" in printed
    assert "| GRPO | 3 | 3/3 (3, 3, 3) | 0.000 [0.000, 0.000] | 0.25 | - |" in printed  # the format's share too


def test_no_recorded_run_says_how_to_make_them(tmp_path):
    with pytest.raises(SystemExit, match="bench/study.py --run"):
        study.main(["--corpus", str(tmp_path), "--out", str(tmp_path / "out")])


def write_smollm2(corpus, study_dir, variant, seed, rewards, ems, warm="abc", unanswered=0, **extra):
    """A SmolLM2 run as bench/smollm2_corpus.py leaves it: its corpus file and its held-out rows (the last
    ``unanswered`` of them with no answer)."""
    from bench import smollm2_corpus

    metrics = {s: {"critic/score/mean": r, "actor/entropy": 0.5, "probe/logp": -0.1, "search_r1/searches": 1.0}
               for s, r in enumerate(rewards, 1)}
    header = {"model": "smollm2-135m-instruct", "variant": variant, "seed": seed, "steps": len(rewards),
              "fault": False, "warm_start": warm, **extra}
    record(metrics, header, smollm2_corpus.corpus_file(corpus, variant, seed))
    rows = [{"uid": f"q{i}", "data_source": "nq", "em": e, "f1": e,
             "answer": "" if i >= len(ems) - unanswered else "a", "searches": 1} for i, e in enumerate(ems)]
    smollm2_corpus.write_rows(rows, smollm2_corpus.heldout_file(study_dir, f"{variant}-s{seed}"))


def test_smollm2_heldout_em_is_paired_by_seed_and_question(tmp_path, capsys):
    from bench import smollm2_corpus

    corpus, out = tmp_path / "corpus", tmp_path / "out"
    healthy = [0.2, 0.3, 0.4, 0.5, 0.5, 0.5]
    smollm2_corpus.write_rows([{"uid": f"q{i}", "data_source": "nq", "em": 0.0} for i in range(20)],
                              smollm2_corpus.heldout_file(out, "warm_start"))
    for seed in (0, 1, 2):
        base = [1.0 if i < 4 + seed else 0.0 for i in range(20)]           # GRPO: 4, 5, 6 of 20 right
        better = [1.0 if i < 6 + seed else 0.0 for i in range(20)]         # LLDS: the same plus 2 more, every seed
        write_smollm2(corpus, out, "grpo_lrx10_updates4", seed, healthy, base, unanswered=5)
        write_smollm2(corpus, out, "llds_lrx10_updates4", seed, healthy, better)
        if seed < 2:  # LLDS-MA on two seeds: LLDS's answers but one of them, the same on both seeds
            write_smollm2(corpus, out, "lldsma_lrx10_updates4", seed, healthy, [e if i else 0.0 for i, e in
                                                                                   enumerate(better)])
    study.main(["--model", "smollm2", "--corpus", str(corpus), "--out", str(out)])
    summary = json.loads((out / "smollm2.json").read_text())
    between = summary["between_fixes"]["lrx10_updates4"]
    assert list(between) == ["llds - lldsma"] and between["llds - lldsma"]["seeds"] == [0, 1]
    assert between["llds - lldsma"]["diff"] == pytest.approx(0.05)  # 1 of 20 questions, on the seeds both ran
    held = summary["heldout"]["lrx10_updates4"]
    assert held["grpo"]["em"] == pytest.approx(0.25) and held["llds"]["em"] == pytest.approx(0.35)
    assert held["llds"]["vs_grpo"]["diff"] == pytest.approx(0.1)
    lo, hi = held["llds"]["vs_grpo"]["ci95"]
    assert 0 < lo < 0.1 < hi  # questions resampled: the gap is not the same on every draw
    lo, hi = held["grpo"]["em_ci95"]
    assert lo < 0.2 and hi > 0.3  # covers the seeds' 0.20..0.30 and the questions' spread
    assert held["llds"]["gain"]["em"] == pytest.approx(0.35) and held["llds"]["gain"]["warm_start_em"] == 0.0
    assert summary["training"]["lrx10_updates4"]["grpo"]["collapsed"] == 0
    assert held["grpo"]["answered"] == pytest.approx(0.75) and held["llds"]["answered"] == 1.0
    printed = capsys.readouterr().out
    assert "| GRPO+LLDS | 3 | 0.350 [" in printed and "] | 0.75 | " in printed
    assert "| GRPO+LLDS minus GRPO+LLDS-MA | 2 | +0.050 [" in printed
    assert "rebuilt warm start" not in printed

    check = {"answers_equal": 0.97, "em": 0.14, "recorded_em": 0.14, "same": True}
    write_smollm2(corpus, out, "llds_lrx10_updates4", 2, healthy, better, warm_start_weights="def",
                  warm_start_check=check)
    study.main(["--model", "smollm2", "--corpus", str(corpus), "--out", str(out)])
    printed = capsys.readouterr().out
    assert ("1 run(s) started from a rebuilt warm start" in printed
            and "llds_lrx10_updates4-s2 (weights def: answers agree on 97.0%, EM 0.140 vs 0.140)" in printed)


def test_two_level_bootstrap_covers_the_spread_between_seeds():
    # per seed, every question agrees: resampling questions alone would give a zero-width interval per seed
    lo, hi = study.bootstrap_two_level([[0.0] * 50, [1.0] * 50, [0.5] * 50])
    assert lo <= 0.2 and hi >= 0.8
    assert study.bootstrap_two_level([[0.3] * 10, [0.3] * 10]) == [0.3, 0.3]


def test_runs_from_two_warm_starts_are_refused(tmp_path):
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    write_smollm2(corpus, out, "grpo", 0, [0.2, 0.3], [1.0, 0.0], warm="abc")
    write_smollm2(corpus, out, "llds", 0, [0.2, 0.3], [1.0, 0.0], warm="def")
    with pytest.raises(SystemExit, match="2 different warm starts"):
        study.main(["--model", "smollm2", "--corpus", str(corpus), "--out", str(out)])
