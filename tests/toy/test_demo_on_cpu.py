"""`python -m train.demo`: the steps of `make demo` that read its results, and the checks it must pass.

The demo itself runs in CI (`.ci/run` runs `make demo`); these tests run each step on small files so
that a broken import or a wrong criterion fails in the fast tier, not 10 minutes into the demo.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import refuses, run_command
from train import demo
from train.toy import demo_checks as checks


def write_run(demo_dir: Path, rewards: list[float], *, resumed: bool = True, before=(0, 0, 1), after=(1, 1, 1),
              plots: bool = True, alarm_at=(), watch_at=(3,)) -> Path:
    """A demo's output folder as scripts/demo.sh leaves it: metrics (steps 1..N, + N+1 if resumed), the two
    evaluation files, and the plots (drawn by python -m train.plot from those metrics)."""
    run = demo_dir / "learn"
    run.mkdir(parents=True)
    steps = list(enumerate(rewards, 1)) + ([(len(rewards) + 1, rewards[-1])] if resumed else [])
    with open(run / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "data": {"val-core/facts/reward/mean@1": 0.0}}) + "\n")
        for s, r in steps:
            level = 2.0 if s in alarm_at else 1.0 if s in watch_at else 0.0
            f.write(json.dumps({"step": s, "data": {"critic/score/mean": r, "search_r1/searches": 1.0,
                                                    "actor/llds/penalty": 0.01, "search_r1/warning": level,
                                                    "search_r1/signal/probe": 0.1 * level,
                                                    "search_r1/signal_level/probe": level}}) + "\n")
    for name, ems in (("eval_before.jsonl", before), ("eval_after.jsonl", after)):
        with open(demo_dir / name, "w") as f:
            for i, em in enumerate(ems):
                f.write(json.dumps({"uid": f"test-{i}", "question": f"What is the capital of X{i}?",
                                    "golds": [f"C{i}"], "answer": f"C{i}" if em else "Big", "em": em}) + "\n")
    if plots:
        from train import plot

        assert plot.main([str(run)]) in (0, None)
    return run


RISING = [0.2, 0.3, 0.3, 0.5, 0.6, 0.7, 0.7, 0.8]


def test_check_passes_a_demo_that_learned(tmp_path, capsys):
    write_run(tmp_path, RISING)
    rc, out = run_command(demo.main, ["check", str(tmp_path), "--steps", str(len(RISING))], capsys)
    assert rc == 0, out
    assert "ok    reward rose: mean of the first 3 steps 0.267, of the last 3 0.733 (+0.467" in out
    assert "ok    held-out EM rose: warm start 0.333 -> after RL 1.000 (3 questions" in out
    assert "ok    resumed: steps 1-8 and, after resuming from the step-8 checkpoint, step 9" in out
    assert "ok    plots written: reward.png, search.png, llds.png, lld.png, warning.png" in out
    assert "ok    no collapse alarm: 9 steps, no ALARM (WATCH at steps [3])" in out
    assert "demo passed: all 5 checks" in out


@pytest.mark.parametrize("case, kwargs, failed", [
    ("flat reward", {"rewards": [0.5] * 8}, "reward rose"),
    # the resumed step (9) is not part of the run: a high reward there does not make a rise
    ("falling reward", {"rewards": [0.7, 0.7, 0.7, 0.5, 0.4, 0.3, 0.3, 0.3]}, "reward rose"),
    ("EM fell", {"before": (1, 1, 0), "after": (0, 0, 1)}, "held-out EM rose"),
    ("EM unchanged", {"before": (1, 0, 0), "after": (0, 0, 1)}, "held-out EM rose"),
    ("other questions", {"after": (1, 1)}, "held-out EM rose"),
    ("no resume", {"resumed": False}, "resumed"),
    ("no plots", {"plots": False}, "plots written"),
    ("a false alarm", {"alarm_at": (5,)}, "no collapse alarm"),
])
def test_check_fails_naming_what_did_not_happen(tmp_path, capsys, case, kwargs, failed):
    kwargs.setdefault("rewards", RISING)
    write_run(tmp_path, **kwargs)
    rc, out = run_command(demo.main, ["check", str(tmp_path), "--steps", "8"], capsys)
    assert rc == 1, (case, out)
    assert f"FAIL  {failed}:" in out and f"demo FAILED: {failed}" in out, (case, out)
    assert out.count("FAIL  ") == 1, (case, out)


def test_rise_threshold_and_too_few_steps():
    steps = {s: {"critic/score/mean": r} for s, r in enumerate([0.5, 0.5, 0.5, 0.55, 0.6, 0.6], 1)}
    assert not checks.reward_check(steps, 6).passed  # +0.083 < MIN_RISE
    steps[6]["critic/score/mean"] = 0.8
    assert checks.reward_check(steps, 6).passed  # +0.10
    c = checks.reward_check({1: {"critic/score/mean": 0.1}}, 1)
    assert not c.passed and "at least 6" in c.detail


def test_check_without_a_run_names_the_missing_file(tmp_path, capsys):
    refuses(demo.main, ["check", str(tmp_path), "--steps", "30"], capsys, r"no metrics file at .*learn/metrics.jsonl",
            code=2)
    write_run(tmp_path, RISING)
    (tmp_path / "eval_after.jsonl").unlink()
    refuses(demo.main, ["check", str(tmp_path), "--steps", "8"], capsys, r"no evaluation file at .*eval_after.jsonl",
            code=2)


def test_compare_and_question(tmp_path, capsys):
    write_run(tmp_path, RISING, plots=False)
    rc, out = run_command(demo.main, ["compare", str(tmp_path / "eval_before.jsonl"),
                                      str(tmp_path / "eval_after.jsonl")], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == ("held-out EM (3 questions no stage trained on, greedy): warm start 0.333 -> after RL 1.000")
    assert lines[2].split() == ["What", "is", "the", "capital", "of", "X0?", "C0", "Big", "C0"]
    rc, out = run_command(demo.main, ["question", str(tmp_path / "eval_after.jsonl")], capsys)
    assert (rc, out) == (0, "What is the capital of X0?\n")


def test_dense_searches_an_index_as_the_policy_reads_it(dense_index_dir, capsys):
    rc, out = run_command(demo.main, ["dense", str(dense_index_dir), "--query", "American Splendor comic"], capsys)
    assert rc == 0, out
    assert "dense index" in out and "(300 passages)" in out and "<information>Doc 1(Title:" in out
    refuses(demo.main, ["dense", str(dense_index_dir / "nope")], capsys, "no index folder at .*nope", code=2)


def test_step_metrics_prints_the_table_and_the_rise(tmp_path):
    """The demo's table of every step (`python scripts/step_metrics.py LOG`, run by path: its imports of the
    project are only seen when it runs)."""
    import subprocess
    import sys

    log = tmp_path / "train.log"
    log.write_text("".join(f"(TaskRunner pid=1) step:{s} - critic/score/mean:{r} - search_r1/searches:1.0\n"
                           for s, r in enumerate(RISING, 1)))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "scripts/step_metrics.py", str(log)], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split()[:2] == ["1", "0.2"]
    assert "reward: mean of the first 3 steps 0.267, of the last 3 steps 0.733 (+0.467)" in r.stdout


def test_the_test_question_is_a_held_out_nq_question(capsys):
    from train import DATA_DIR

    assert demo.main(["test-question"]) == 0
    q = capsys.readouterr().out.strip()
    test = set(json.loads((DATA_DIR / "split.json").read_text())["test"])
    recs = [json.loads(line) for line in (DATA_DIR / "qa.jsonl").read_text().splitlines()]
    rec = next(r for r in recs if r["question"] == q)
    assert rec["id"] in test and rec["dataset"] == "nq"



def _descendants(pid: int) -> dict[int, str]:
    """The live descendants of ``pid``: {pid: command line}."""
    import subprocess

    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True).stdout
    procs = [line.split(None, 3) for line in out.splitlines() if line.strip()]
    children: dict[int, list] = {}
    for p, pp, stat, args in procs:
        if not stat.startswith("Z"):
            children.setdefault(int(pp), []).append((int(p), args))
    found, todo = {}, [pid]
    while todo:
        for child, args in children.get(todo.pop(), []):
            found[child] = args
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_term_to_the_demo_script_alone_stops_its_running_stage(tmp_path):
    """`kill PID` (or a scheduler, or `timeout`) signals the script, not its stage: bash would die and leave the
    stage (here the warm start's training, minutes of both cores) running as an orphan. scripts/_group.sh runs
    the stages as one process group under the script's PID and passes the TERM on to all of them."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "DEMO_DIR": str(tmp_path / "demo"), "PYTHON": sys.executable, "PORT": "1"}
    env.pop("_STAGES_GROUP", None)
    script = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=Path(__file__).resolve().parents[2], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    stage: list[int] = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not stage:  # the first stage: python -m train.learnable
            time.sleep(0.5)
            stage = [p for p, args in _descendants(script.pid).items() if "-m train.learnable" in args]
        assert stage, "the demo's first stage did not start within 120 s"
        script.send_signal(signal.SIGTERM)  # to the script's PID alone, as `kill PID` does
        assert script.wait(timeout=60) == 143
        deadline = time.time() + 30
        while any(map(_alive, stage)) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(map(_alive, stage)), "the stage ran on after its script was stopped"
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
        for pid in stage:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
