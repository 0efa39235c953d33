"""Memory-mapped passage store for wiki-18-format jsonl (``{"id", "contents"}`` per line).

The jsonl file is memory-mapped and a ``uint64`` array of line start offsets (``.npy``, itself
memory-mapped) gives O(1) access by row, so a 21M-passage corpus costs two mmaps and no
Python objects until a row is read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

_CHUNK = 64 << 20


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message names the file and line."""


_SAMPLE_BLOCKS, _BLOCK = 64, 4096


def fingerprint(path: str | os.PathLike, rows: int) -> dict:
    """A cheap identity of a corpus file: its row count, byte size and a SHA-256 over the first and
    last 64 KiB plus 64 blocks of 4 KiB spread over the file. Inserting, deleting or reordering lines
    changes it; what the server checks at start-up (milliseconds, even for wiki-18)."""
    path = Path(path)
    size = path.stat().st_size
    h = hashlib.sha256(f"{size}:{rows}".encode())
    with open(path, "rb") as f:
        for pos in [0, max(size - 65536, 0)] + [size * i // _SAMPLE_BLOCKS for i in range(1, _SAMPLE_BLOCKS)]:
            f.seek(pos)
            h.update(f.read(65536 if pos in (0, max(size - 65536, 0)) else _BLOCK))
    return {"rows": int(rows), "bytes": int(size), "sample_sha256": h.hexdigest()}


def content_sha256(path: str | os.PathLike, *, progress: bool = True) -> str:
    """SHA-256 of the whole file (the index builder's resume key: an edited passage changes it)."""
    path = Path(path)
    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=f"hashing {path.name}", disable=not progress) as bar:
        while buf := f.read(_CHUNK):
            h.update(buf)
            bar.update(len(buf))
    return h.hexdigest()


def line_offsets(path: str | os.PathLike, *, progress: bool = True) -> np.ndarray:
    """Start offsets of every line of ``path`` (plus a final end offset), as uint64 [n + 1]."""
    path = Path(path)
    size = path.stat().st_size
    starts = [np.zeros(1, dtype=np.uint64)]
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True, desc=f"indexing {path.name}",
                                     disable=not progress) as bar:
        pos = 0
        while True:
            buf = f.read(_CHUNK)
            if not buf:
                break
            nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == 10).astype(np.uint64)
            starts.append(nl + np.uint64(pos + 1))
            pos += len(buf)
            bar.update(len(buf))
    offsets = np.concatenate(starts)
    if offsets[-1] != size:  # last line without a trailing newline
        offsets = np.append(offsets, np.uint64(size))
    return offsets


class CorpusStore:
    """O(1) passage lookup by row over a jsonl file.

    ``offsets_path``: where the line-offset array lives (built on first use; default
    ``<corpus>.offsets.npy``, or pass a writable path for a read-only corpus).
    """

    def __init__(self, path: str | os.PathLike, offsets_path: Optional[str | os.PathLike] = None,
                 *, progress: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"corpus file not found: {self.path}")
        self.offsets_path = Path(offsets_path) if offsets_path else self.path.with_name(self.path.name + ".offsets.npy")
        size = self.path.stat().st_size
        offsets = None
        if self.offsets_path.is_file():
            try:
                offsets = np.load(self.offsets_path, mmap_mode="r")
                if offsets.ndim != 1 or len(offsets) == 0 or int(offsets[-1]) != size or int(offsets[0]) != 0:
                    offsets = None  # stale: the corpus changed
            except (ValueError, OSError, EOFError):
                offsets = None  # unreadable (truncated, not .npy): rebuilt below
        if offsets is None:
            offsets = line_offsets(self.path, progress=progress)
            self.offsets_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.offsets_path.with_name(self.offsets_path.name + ".tmp.npy")
            np.save(tmp, offsets)
            os.replace(tmp, self.offsets_path)
            offsets = np.load(self.offsets_path, mmap_mode="r")
        self._file = open(self.path, "rb")
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        # trailing blank lines are not passages
        n = len(offsets) - 1
        while n > 0 and not self._mm[int(offsets[n - 1]): int(offsets[n])].strip():
            n -= 1
        self._offsets = offsets[: n + 1]

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def raw(self, row: int) -> bytes:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range for corpus {self.path} with {len(self)} passages")
        return self._mm[int(self._offsets[row]): int(self._offsets[row + 1])]

    def get(self, row: int) -> dict:
        """The corpus row as a dict (``id``, ``contents``, and any other fields)."""
        raw = self.raw(row)
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise CorpusError(f"{self.path}:{row + 1}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                              f"convert the corpus, e.g. iconv -f latin1 -t utf-8") from None
        except json.JSONDecodeError as e:
            what = "a blank line" if not raw.strip() else f"not valid JSON ({e.msg})"
            raise CorpusError(f"{self.path}:{row + 1}: {what}") from None
        if not isinstance(doc, dict) or "contents" not in doc:
            raise CorpusError(f"{self.path}:{row + 1}: expected an object with a 'contents' field")
        if not isinstance(doc["contents"], str):
            raise CorpusError(f"{self.path}:{row + 1}: 'contents' is {type(doc['contents']).__name__}, not a string")
        doc.setdefault("id", str(row))
        doc["id"] = str(doc["id"])
        return doc

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()
