"""The one resumable results file of asking questions: ``infer.py --file`` and ``python -m train.evaluate``.

A jsonl with a row per question, keyed by the input's id (``key``: ``id`` for infer.py, ``uid`` for the
evaluator). :class:`ResultsFile`:

- **open**: reads the rows already there (an earlier, maybe interrupted, run). A line cut by a kill is
  skipped; a row that :func:`saw_failed_search` is not a result and is dropped, so it is asked again;
  a row for the same id but another question (or gold answers) means the file belongs to other input:
  refused with a :class:`~train.errors.DataError` naming the file and the id. The file is rewritten
  without what was skipped (:func:`train.files.atomic_write`), so appends start on a whole line;
- **settings**: what made the rows (``made_by``: :meth:`train.inference.settings.AskSettings.answer_settings`,
  the weights, backend, dtype, method, search budget and sampling) is kept beside the file
  (``<file>.settings.json``). A resume with other settings is refused, naming what differs: rows of two models
  or two search budgets never mix in one file. Rows with no such record (a file from before it existed) are
  resumed with a note; the record is written then;
- **append**: each finished row is written and flushed at once (a crash loses no finished row);
- **finish**: the file is rewritten with the input's rows first, in input order (appends come in the
  order questions finished), then any row for other ids that an earlier run left.

No torch, verl or transformers import here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Optional, Sequence

from train.errors import DataError
from train.files import atomic_write
from train.search_r1 import protocol


def saw_failed_search(d: dict) -> bool:
    """A stored row whose trajectory got the failure observation (older files have no count)."""
    return int(d.get("failed_searches") or 0) > 0 or protocol.SEARCH_FAILED_TEXT in str(d.get("trajectory", ""))


def differences(before: dict, now: dict, ignore=()) -> str:
    """``"key <before> there, <now> now; ..."`` for each key whose value differs (keys in ``ignore`` left out);
    empty when none does. The one wording of a settings mismatch (results files, the checkpoint sweep)."""
    return "; ".join(f"{k} {before.get(k)!r} there, {now.get(k)!r} now" for k in sorted(before.keys() | now.keys())
                     if k not in ignore and before.get(k) != now.get(k))


def _lines(rows) -> str:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows)


class ResultsFile:
    """A resumable jsonl of results for ``rows`` (each with ``key`` and the ``same`` fields)."""

    #: recorded in the settings file for a reader, not compared (a copied model folder is the same model)
    UNCOMPARED = ("model_path",)

    def __init__(self, path: str | Path, rows: Sequence[dict], *, key: str, same: Sequence[str] = ("question",),
                 made_by: Optional[dict] = None, log=print):
        self.path, self.key, self.same, self.log = Path(path), key, tuple(same), log
        self.made_by = dict(made_by) if made_by is not None else None
        self.rows = list(rows)
        self.done: dict[str, dict] = {}
        self._f: Optional[IO[str]] = None

    @staticmethod
    def read(path: str | Path, key: str, log=print) -> dict[str, dict]:
        """``{id: row}`` of the whole, finished rows of a file (none when it is missing)."""
        path = Path(path)
        done: dict[str, dict] = {}
        redo = 0
        if not path.is_file():
            return done
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by an interruption is redone
                if not isinstance(d, dict) or key not in d:
                    continue
                if saw_failed_search(d):
                    redo += 1
                    continue
                done[str(d[key])] = d
        if redo:
            log(f"{path}: {redo} rows saw a failed search; they are redone")
        return done

    def open(self) -> "ResultsFile":
        """Read what is there (refusing a file for other input), rewrite it clean, open it for appends."""
        done = self.read(self.path, self.key, self.log)
        by_id = {str(r[self.key]): r for r in self.rows}
        stale = [k for k, d in done.items()
                 if k in by_id and tuple(d.get(f) for f in self.same) != tuple(by_id[k].get(f) for f in self.same)]
        if stale:
            what = " or ".join(self.same)
            raise DataError(f"{self.path} holds results for other data: {len(stale)} rows (e.g. {self.key} "
                            f"{stale[0]!r}) have a different {what} than the input; pass another --out, or "
                            f"delete the file to start over")
        self._check_settings(done)
        self.done = done
        ours = sum(k in done for k in by_id)
        if ours:
            self.log(f"resuming: {ours} of {len(self.rows)} rows already in {self.path}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            atomic_write(self.path, _lines(done.values()))
        self._f = open(self.path, "a", encoding="utf-8")
        return self

    @property
    def settings_path(self) -> Path:
        return self.path.with_name(self.path.name + ".settings.json")

    def _check_settings(self, done: dict[str, dict]) -> None:
        """Refuse rows made with other settings than ``made_by``; then record ``made_by`` beside the file."""
        if self.made_by is None:
            return
        side = self.settings_path
        if done and side.is_file():
            try:
                before = json.loads(side.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise DataError(f"{side}: unreadable ({e}); it records what made the rows of {self.path}: "
                                f"delete both to start over") from None
            said = differences(before, self.made_by, self.UNCOMPARED)
            if said:
                was = (f" (the model there: {before['model_path']})"
                       if before.get("weights") != self.made_by.get("weights") and before.get("model_path") else "")
                raise DataError(f"{self.path} holds {len(done)} rows made with other settings ({side}): {said}"
                                f"{was}; pass another --out, or delete the file and {side.name} to start over")
        elif done:
            self.log(f"{self.path}: no record of the settings that made its {len(done)} rows ({side.name}); "
                     "they are taken as this run's")
        side.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(side, json.dumps(self.made_by, indent=1, sort_keys=True) + "\n")

    def todo(self) -> list[dict]:
        """The input rows without a result yet, in input order."""
        return [r for r in self.rows if str(r[self.key]) not in self.done]

    def append(self, d: dict) -> None:
        assert self._f is not None, "open() first"
        self._f.write(json.dumps(d, ensure_ascii=False) + "\n")
        self._f.flush()
        self.done[str(d[self.key])] = d

    def results(self) -> list[dict]:
        """The input's rows that have a result, in input order."""
        return [self.done[str(r[self.key])] for r in self.rows if str(r[self.key]) in self.done]

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def finish(self) -> list[dict]:
        """Close, rewrite in input order (other ids after), and return :meth:`results`."""
        self.close()
        ours = self.results()
        mine = {str(r[self.key]) for r in self.rows}
        atomic_write(self.path, _lines([*ours, *(d for k, d in self.done.items() if k not in mine)]))
        return ours

    def __enter__(self) -> "ResultsFile":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
