"""Writing a file so that a reader, or a run stopped half-way, sees the old content or the new, never
a part: :func:`atomic_write`, the one writer the project's resumable files go through (the results
files of ``infer.py`` and the evaluator, the checkpoint tracker and manifests, the metrics file after a
resume, the sweep's ``best.json``). No import beyond the standard library: every module may use it.
"""

from __future__ import annotations

import os


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's or a folder's entry to disk (a rename is durable once its folder is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory: the data files were synced
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path``: a temporary file in the same folder (so the rename cannot cross file
    systems), flushed and synced, renamed over ``path``, then the folder synced. A failure leaves the
    old file as it was and no temporary file behind."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_path(folder)
