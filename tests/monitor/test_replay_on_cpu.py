"""CI replays the detectors over the committed collapse corpus (bench/collapse_corpus/, no training): the
tables bench/RESULTS.md shows are what the replay prints today (the toy's runs, fitted and scored across
folds, then SmolLM2's runs scored with the levels fitted on the toy), and the levels the presets ship are
the ones fitted on the toy's runs. A change to a signal, the label, the scoring or the corpus that moves a number fails
here until RESULTS.md and configs/_base.yaml say the new one."""

import json
import subprocess
import sys
from pathlib import Path

from bench import refresh_results

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "bench" / "collapse_corpus"
#: the levels are fitted on the toy's runs only; SmolLM2's runs are the test set no choice saw
FIT, TEST = CORPUS / "toy", CORPUS / "smollm2"
#: the variants kept out of every choice of signal and margin: the ones RESULTS.md's command names
HOLDOUT = refresh_results.HOLDOUT


def replay(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train.collapse", "replay", *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_results_md_holds_the_replayed_table_and_the_presets_ship_the_fitted_levels():
    from omegaconf import OmegaConf

    r = replay(str(FIT), "--holdout", *HOLDOUT, "--test", str(TEST))
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    rows = [line for line in out if line.startswith("| ")]
    assert len(rows) >= 25, out  # three tables: each a header, a rule, the warning and its baselines
    titles = [line for line in out if line.startswith(("held out:", "test:"))]
    assert [t.split(":")[0] for t in titles] == ["held out", "test"], out
    assert "smollm2-135m-instruct" in titles[1], out
    missing = [line for line in [out[0], *titles, *rows] if line not in results]
    assert not missing, "bench/RESULTS.md does not hold the replayed table; now:\n" + "\n".join(out)
    fitted = json.loads(out[-1].split(": ", 1)[1])
    base = OmegaConf.to_container(OmegaConf.load(ROOT / "configs" / "_base.yaml").collapse_warning)
    assert {k: list(v) for k, v in base["levels"].items()} == fitted["levels"]
    assert base["watch_votes"] == fitted["watch_votes"]


def test_a_test_corpus_the_levels_were_fitted_on_is_refused():
    for test in (FIT, CORPUS):  # the fitted corpus itself, or a folder that holds it
        r = replay(str(FIT), "--test", str(test))
        assert r.returncode != 0 and "--test" in r.stderr and "fitted on" in r.stderr, r.stderr


def test_every_corpus_run_is_complete_and_labelled():
    from train.monitor.labels import label
    from train.monitor.records import read_corpus

    runs = read_corpus(CORPUS)
    for run in runs:
        steps = [s["step"] for s in run.steps]
        assert run.header.get("crashed") or steps == list(range(1, run.header["steps"] + 1)), run.name
        assert label(run).kind in ("collapse", "healthy", "transient", "censored")
    assert {r.header["model"] for r in runs} >= {"toy"}
