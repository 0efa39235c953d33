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
