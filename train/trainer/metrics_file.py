"""The run's metrics file: one jsonl beside its checkpoints, appended across restarts.

verl's file logger (``trainer.logger: [..., file]``) opens ``VERL_FILE_LOGGER_PATH`` with ``"wb"``, so
every rerun, even one that fails at once, empties the metrics of the steps before; without the
variable it writes ``./<project>/<experiment>.jsonl`` under the working directory, where the next run
of the same preset overwrites it (and a Ray job's working directory is temporary). So ``train.main``:

- points the logger at ``<trainer.default_local_dir>/metrics.jsonl`` unless ``VERL_FILE_LOGGER_PATH``
  is set (:func:`path_for`);
- before Ray starts, keeps the rows up to the step the run resumes from and drops the later ones
  (their steps are trained again; a step's training metrics are never logged twice), or moves the
  file aside when the run starts from scratch (:func:`keep_until`);
- in the trainer's process, has verl's logger append instead of truncate (:func:`appending`).

Rows are verl's ``{"step": N, "data": {...}}``; a resumed run logs its first validation at the resume
step again, and the one reader (:func:`read_metrics`) merges the rows of a step.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

NAME = "metrics.jsonl"
ENV = "VERL_FILE_LOGGER_PATH"


def path_for(trainer_logger, checkpoint_dir: str, environ=os.environ) -> str | None:
    """Where the file logger writes (absolute), or None when ``file`` is not among the loggers."""
    from train.trainer.preflight import as_list

    if "file" not in as_list(trainer_logger):
        return None
    return os.path.abspath(environ.get(ENV) or os.path.join(checkpoint_dir, NAME))


def read_rows(path: str) -> list[dict]:
    """The whole rows of a metrics file (a line cut by a crash is skipped)."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows


def read_metrics(path: str | os.PathLike, warn=None) -> dict[int, dict[str, float]]:
    """``{step: {metric: value}}`` of a run's metrics file (or its folder), the lines of one step merged.

    The one reader of the file (plots, the learning checks, the checkpoint sweep): a line that is not a
    whole verl file-logger row (the last line of a run killed while writing it) is skipped and named
    in one ``warn`` call (stderr by default). A missing or empty file is a :class:`~train.errors.DataError`."""
    from train.errors import DataError

    path = Path(path)
    if path.is_dir():
        path = path / NAME
    if not path.is_file():
        raise DataError(f"{path}: no metrics file (run with trainer.logger=[console,file] and "
                        f"{ENV}=RUN_DIR/{NAME})")
    steps: dict[int, dict[str, float]] = {}
    skipped = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                step, data = int(rec["step"]), dict(rec["data"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                skipped.append(n)
                continue
            row = steps.setdefault(step, {})
            for k, v in data.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[k] = float(v)
    if skipped:
        (warn or (lambda s: print(s, file=sys.stderr)))(
            f"{path}: skipped {len(skipped)} line(s) that are not whole verl file-logger rows (line "
            f"{', '.join(map(str, skipped[:5]))}{', ...' if len(skipped) > 5 else ''}; a run killed while writing?)")
    if not steps:
        raise DataError(f"{path}: the metrics file holds no step")
    return steps


def keep_until(path: str, step: int, log=print) -> int:
    """Prepare ``path`` for a run that resumes from ``step`` (0 = from scratch): keep the rows of
    steps <= ``step``, drop the rest (rewritten atomically); from scratch, move a non-empty file aside
    to ``<path>.<UTC time>``. Returns the rows kept."""
    from train.files import atomic_write

    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return 0
    if step <= 0:
        aside = f"{path}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        os.replace(path, aside)
        log(f"metrics: this run starts from scratch; the earlier metrics moved to {aside}")
        return 0
    rows = read_rows(path)
    kept = [r for r in rows if r["step"] <= step]
    dropped = sorted({r["step"] for r in rows if r["step"] > step})
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
    log(f"metrics: {path}: resuming after step {step}, {len(kept)} rows kept"
        + (f", steps {dropped[0]}-{dropped[-1]} dropped (they are trained again)" if dropped else ""))
    return len(kept)


@contextlib.contextmanager
def appending():
    """While the trainer builds its loggers: verl's file logger appends to its file (the rows before
    the resume step were kept by :func:`keep_until`) instead of truncating it."""
    import verl.utils.tracking as tracking

    base = tracking.FileLogger

    class AppendingFileLogger(base):
        def __init__(self, project_name: str, experiment_name: str):
            self.project_name, self.experiment_name = project_name, experiment_name
            self.filepath = os.environ.get(ENV) or os.path.join(
                os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", ".")), project_name,
                f"{experiment_name}.jsonl")
            os.makedirs(os.path.dirname(os.path.abspath(self.filepath)), exist_ok=True)
            print(f"metrics: appending to {os.path.abspath(self.filepath)}", flush=True)
            self.fp = open(self.filepath, "ab", buffering=0)

    tracking.FileLogger = AppendingFileLogger
    try:
        yield AppendingFileLogger
    finally:
        tracking.FileLogger = base
