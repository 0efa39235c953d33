"""The one resumable results file (train/inference/results_file.py) of infer.py --file and the evaluator."""

from __future__ import annotations

import json

import pytest

from train.errors import DataError
from train.files import atomic_write
from train.inference.results_file import ResultsFile

ROWS = [{"uid": f"u{i}", "question": f"q{i}", "golds": [f"a{i}"]} for i in range(4)]


def result(row, **extra):
    return {"uid": row["uid"], "question": row["question"], "golds": row["golds"], "em": 1.0, **extra}


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_resume_skips_a_cut_line_and_a_failed_search_then_finishes_in_input_order(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(result(ROWS[2])) + "\n"
                    + json.dumps(result(ROWS[1], failed_searches=1)) + "\n"
                    + json.dumps(result(ROWS[0]))[:20])  # killed while writing
    printed = []
    f = ResultsFile(path, ROWS, key="uid", same=("question", "golds"), log=printed.append).open()
    assert [r["uid"] for r in f.todo()] == ["u0", "u1", "u3"]
    assert printed == [f"{path}: 1 rows saw a failed search; they are redone",
                       f"resuming: 1 of 4 rows already in {path}"]
    assert [d["uid"] for d in lines(path)] == ["u2"]  # rewritten clean before any append
    for row in (ROWS[3], ROWS[0]):
        f.append(result(row))
    assert [d["uid"] for d in lines(path)] == ["u2", "u3", "u0"]  # as they finished, each flushed at once
    assert [d["uid"] for d in f.finish()] == ["u0", "u2", "u3"]
    assert [d["uid"] for d in lines(path)] == ["u0", "u2", "u3"]


def test_a_file_for_other_questions_is_refused_naming_it(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({**result(ROWS[1]), "golds": ["other"]}) + "\n")
    with pytest.raises(DataError, match=r"holds results for other data: 1 rows \(e.g. uid 'u1'\) have a different "
                                        r"question or golds than the input; pass another --out"):
        ResultsFile(path, ROWS, key="uid", same=("question", "golds")).open()
    assert lines(path)[0]["golds"] == ["other"]  # nothing lost


def test_rows_for_other_ids_are_kept_after_the_inputs(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"id": "old", "question": "earlier"}) + "\n")
    rows = [{"id": "1", "question": "q1"}, {"id": "2", "question": "q2"}]
    with ResultsFile(path, rows, key="id", log=lambda m: None) as f:
        f.append({"id": "2", "question": "q2"})
        f.append({"id": "1", "question": "q1"})
    assert [d["id"] for d in f.finish()] == ["1", "2"]
    assert [d["id"] for d in lines(path)] == ["1", "2", "old"]


def test_atomic_write_leaves_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    import errno
    import os

    path = tmp_path / "f.txt"
    atomic_write(path, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_infer_and_the_evaluator_use_it():
    """One class, no second reader or writer of results files left in either."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in ("train/infer.py", "train/evaluation/runner.py"):
        text = (root / path).read_text()
        assert "ResultsFile(" in text and "os.replace" not in text and '.tmp"' not in text, path


MADE_BY = {"weights": "aaaa", "model_path": "/m/a", "backend": "hf", "dtype": "auto", "method": "search_r1",
           "max_turns": 4, "topk": 3, "max_new_tokens": 500, "temperature": 0.0}


def test_a_resume_with_another_model_or_budget_is_refused_naming_what_differs(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsFile(path, ROWS, key="uid", same=("question", "golds"), made_by=MADE_BY, log=lambda m: None) as f:
        f.append(result(ROWS[0]))
    assert json.loads((tmp_path / "r.jsonl.settings.json").read_text()) == MADE_BY
    other = {**MADE_BY, "weights": "bbbb", "model_path": "/m/b", "max_turns": 2}
    with pytest.raises(DataError, match=r"r.jsonl holds 1 rows made with other settings .*: max_turns 4 there, 2 now; "
                                        r"weights 'aaaa' there, 'bbbb' now \(the model there: /m/a\); pass another "
                                        r"--out, or delete the file and r.jsonl.settings.json to start over"):
        ResultsFile(path, ROWS, key="uid", same=("question", "golds"), made_by=other).open()
    assert [d["uid"] for d in lines(path)] == ["u0"]  # nothing lost
    assert json.loads((tmp_path / "r.jsonl.settings.json").read_text()) == MADE_BY  # nor the record
    # the same weights from another folder (a copy) resume: the path is recorded, not compared
    moved = {**MADE_BY, "model_path": "/elsewhere/a"}
    with ResultsFile(path, ROWS, key="uid", same=("question", "golds"), made_by=moved, log=lambda m: None) as f:
        assert [r["uid"] for r in f.todo()] == ["u1", "u2", "u3"]


def test_rows_without_a_settings_record_resume_with_a_note_and_get_one(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(result(ROWS[1])) + "\n")
    printed = []
    with ResultsFile(path, ROWS, key="uid", same=("question", "golds"), made_by=MADE_BY, log=printed.append) as f:
        assert len(f.todo()) == 3
    assert printed[0] == (f"{path}: no record of the settings that made its 1 rows (r.jsonl.settings.json); they "
                          "are taken as this run's")
    assert json.loads((tmp_path / "r.jsonl.settings.json").read_text()) == MADE_BY


def test_a_fresh_file_replaces_a_stale_record_and_an_unreadable_one_is_named(tmp_path):
    path, side = tmp_path / "r.jsonl", tmp_path / "r.jsonl.settings.json"
    side.write_text(json.dumps({**MADE_BY, "weights": "old"}))  # its rows were deleted: no rows, no conflict
    with ResultsFile(path, ROWS, key="uid", made_by=MADE_BY, log=lambda m: None) as f:
        f.append(result(ROWS[0]))
    assert json.loads(side.read_text())["weights"] == "aaaa"
    side.write_text("{cut")
    with pytest.raises(DataError, match=r"r.jsonl.settings.json: unreadable .*delete both to start over"):
        ResultsFile(path, ROWS, key="uid", made_by=MADE_BY).open()
