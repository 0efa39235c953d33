"""`make smollm2` (scripts/smollm2_answer.sh): the question it asks is held out, and its check of infer.py's
printout (scripts/heldout_answer.py) passes a correct, searched answer only. The command itself, a
warm start of a few minutes, runs in CI as its quick twin (`STEPS=5 CHECK=tags make smollm2`, .ci/run); these
tests are its fast half."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from train.infer import render

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "smollm2_answer.sh"


@pytest.fixture
def heldout(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import heldout_answer

    return heldout_answer


def default_qid() -> str:
    m = re.search(r"^QID=\$\{QID:-([\w-]+)\}$", SCRIPT.read_text(), re.M)
    assert m, "scripts/smollm2_answer.sh sets no default QID"
    return m.group(1)


def printout(answer, searches=1, model_text=None) -> str:
    """infer.py's printout of one result, as the command pipes it (no colours)."""
    text = model_text or ("<think> I need to find this. </think><search> q </search>\n\n<information>Doc 1 ..."
                          f"</information>\n\n<think> The passages give it. </think><answer> {answer} </answer>")
    result = SimpleNamespace(question="who was president when the panama canal was built", answer=answer,
                             segments=[("model", text)], searches=searches, stop_reason="answered")
    return render(result, colour=False)


def test_the_question_asked_is_held_out_and_the_other_side_is_refused(heldout, capsys):
    qid = default_qid()
    split = json.loads((ROOT / "data" / "split.json").read_text())
    assert qid in split["test"] and qid not in split["train"]
    rec = heldout.heldout_record(qid)
    assert rec["question"] == "who was president when the panama canal was built"
    assert heldout.main(["question", qid]) == 0
    assert capsys.readouterr().out.strip() == rec["question"]
    assert heldout.main(["question", split["train"][0]]) == 2  # a training question is never the one asked
    assert "not a held-out question" in capsys.readouterr().err
    assert heldout.main(["ask", qid]) == 2


def test_the_check_passes_a_correct_searched_answer_only(heldout):
    golds = heldout.heldout_record(default_qid())["golden_answers"]
    ok, why = heldout.check(printout("Theodore Roosevelt"), golds)
    assert ok, why
    assert heldout.check(printout("theodore roosevelt."), golds)[0]  # EM's normalisation
    ok, why = heldout.check(printout("Woodrow Wilson"), golds)
    assert not ok and why.startswith("wrong: 'Woodrow Wilson'")
    ok, why = heldout.check(printout(None, searches=0, model_text="Theodore Roosevelt was president."), golds)
    assert not ok and "protocol" in why  # prose, no tags: the released model's way
    ok, why = heldout.check(printout("Theodore Roosevelt", searches=0,
                                     model_text="<answer> Theodore Roosevelt </answer>"), golds)
    assert not ok and "protocol" in why  # answered without searching
    assert not heldout.check("Traceback (most recent call last): ...", golds)[0]


def test_the_quick_twin_checks_the_protocol_only(heldout):
    golds = heldout.heldout_record(default_qid())["golden_answers"]
    ok, why = heldout.check(printout("Bunau-Varilla"), golds, tags_only=True)
    assert ok and "wrong: 'Bunau-Varilla'" in why  # a wrong answer passes, and says it was wrong
    assert heldout.check(printout("Theodore Roosevelt"), golds, tags_only=True)[0]
    assert not heldout.check(printout(None, searches=0, model_text="In 1904."), golds, tags_only=True)[0]
    assert not heldout.check(printout(None, model_text="<search> q </search>"), golds, tags_only=True)[0]


def test_the_check_reads_a_printout_file_and_exits_1_when_wrong(heldout, tmp_path, capsys):
    qid = default_qid()
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(printout("Theodore Roosevelt") + "\n")
    bad.write_text(printout("Rio de Janeiro") + "\n")
    assert heldout.main(["check", qid, str(good)]) == 0
    assert capsys.readouterr().out.startswith("correct: 'Theodore Roosevelt'")
    assert heldout.main(["check", qid, str(bad)]) == 1
    assert heldout.main(["tags", qid, str(bad)]) == 0
    assert heldout.main(["check", qid, str(tmp_path / "missing.txt")]) == 2


@pytest.mark.parametrize("env, says", [({"STEPS": "ten"}, "STEPS must be an integer >= 1, got 'ten'"),
                                       ({"STEPS": "0"}, "STEPS must be an integer >= 1"),
                                       ({"CHECK": "bogus"}, "CHECK must be answer or tags, got 'bogus'"),
                                       ({"QID": "no_such_id"}, "'no_such_id' is not a held-out question")])
def test_a_bad_setting_exits_2_before_any_work(env, says, tmp_path):
    """A bad STEPS, CHECK or QID is refused at once, naming it, and nothing is written."""
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHON": sys.executable, "OUT": str(out), **env})
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-1000:])
    assert says in r.stderr, r.stderr[-1000:]
    assert not out.exists() and "== 1." not in r.stdout
