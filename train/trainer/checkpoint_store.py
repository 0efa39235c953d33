"""The checkpoint store of a run (``trainer.default_local_dir``): complete checkpoints (a manifest
written last, the tracker written atomically after it), resume that lands on the newest complete
step, free-space checks before a save, and bounded retention: the ``checkpoints.keep_last`` newest
steps plus the ``keep_steps`` that ``scripts/reproduce_paper.sh`` evaluates (a 3B checkpoint with fp32 weights and
Adam state is ~37 GB;
saving every 50 of 1,005 steps without pruning is ~0.8 TB).

verl's own ``trainer.max_actor_ckpt_to_keep`` keeps the newest N only, so it would delete the step the
paper evaluates (650 of 1,005); this prunes whole ``global_step_N`` folders after each save instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Iterable

from train.errors import CheckpointError
from train.files import atomic_write, fsync_path

STEP_DIR = re.compile(r"^global_step_(\d+)$")


def saved_steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(root) if (m := STEP_DIR.match(name))
                  and os.path.isdir(os.path.join(root, name)))


def prune(root: str, keep_last: int | None, keep_steps: Iterable[int] = ()) -> list[int]:
    """Delete ``root/global_step_N`` folders except the newest ``keep_last``, the ``keep_steps`` and
    the one ``latest_checkpointed_iteration.txt`` names. ``keep_last`` None or <= 0 keeps all.
    Returns the steps deleted."""
    if not keep_last or keep_last <= 0:
        return []
    steps = saved_steps(root)
    keep = set(steps[-keep_last:]) | {int(s) for s in keep_steps}
    latest = read_tracker(root)[0]
    if latest is not None:
        keep.add(latest)
    removed = [s for s in steps if s not in keep]
    for s in removed:
        shutil.rmtree(os.path.join(root, f"global_step_{s}"), ignore_errors=True)
    return removed


def check_config(block) -> tuple[int, list[int]]:
    block = dict(block or {})
    unknown = set(block) - {"keep_last", "keep_steps"}
    if unknown:
        raise ValueError(f"unknown checkpoints config keys: {sorted(unknown)} (known: keep_last, keep_steps)")
    keep_last = block.get("keep_last")
    if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 0):
        raise ValueError(f"checkpoints.keep_last must be an integer >= 0 (0 or null keeps all), got {keep_last!r}")
    steps = block.get("keep_steps") or []
    if isinstance(steps, (int, str)):
        steps = [steps]
    try:
        steps = [int(s) for s in steps]
    except (TypeError, ValueError):
        raise ValueError(f"checkpoints.keep_steps must be a list of step numbers, got {block.get('keep_steps')!r}")
    return keep_last, steps


# ---------------------------------------------------------------------------------------------
# Complete checkpoints: a manifest after each save, an atomic tracker, resume from the newest
# complete step. verl writes ``latest_checkpointed_iteration.txt`` with a plain ``open("w")`` right
# after the shards (a full disk leaves it at 0 bytes) and, under ``resume_mode=auto``, trains from
# scratch when it names a missing folder; it never checks that a folder holds every rank's shards.

TRACKER = "latest_checkpointed_iteration.txt"
MANIFEST = "manifest.json"
SHARD = re.compile(r"^(?P<kind>.+)_world_size_(?P<world>\d+)_rank_(?P<rank>\d+)\.pt$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def write_tracker(root: str, step: int) -> None:
    atomic_write(os.path.join(root, TRACKER), str(int(step)))


def _files(folder: str) -> list[str]:
    out = []
    for base, _, names in os.walk(folder):
        for name in names:
            if name == MANIFEST or name.startswith("."):
                continue
            out.append(os.path.relpath(os.path.join(base, name), folder))
    return sorted(out)


def write_manifest(folder: str) -> dict:
    """After a save: sync every file of ``global_step_N`` to disk, then record each file's size in
    ``manifest.json`` (written atomically). Returns the manifest."""
    files = {}
    for rel in _files(folder):
        path = os.path.join(folder, rel)
        fsync_path(path)
        files[rel] = os.path.getsize(path)
    manifest = {"files": files, "bytes": sum(files.values())}
    atomic_write(os.path.join(folder, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def _zip_complete(path: str) -> bool:
    """torch.save writes a zip archive whose directory is at the end: a cut file has none."""
    import zipfile

    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def problems(folder: str) -> list[str]:
    """Why ``global_step_N`` cannot be resumed from (empty when it is complete). With a manifest:
    every listed file at its recorded size. Without one (a save cut before the manifest, or an
    older run): ``data.pt`` (verl writes it after all shards) and, per shard kind, the shards of every
    rank, each a whole archive."""
    if not os.path.isdir(folder):
        return [f"{folder} does not exist"]
    out = []
    mpath = os.path.join(folder, MANIFEST)
    if os.path.isfile(mpath):
        try:
            with open(mpath, encoding="utf-8") as f:
                files = dict(json.load(f)["files"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            return [f"{mpath} is unreadable ({type(e).__name__}: {e})"]
        for rel, size in files.items():
            path = os.path.join(folder, rel)
            if not os.path.isfile(path):
                out.append(f"{path} is missing")
            elif os.path.getsize(path) != int(size):
                out.append(f"{path} has {os.path.getsize(path)} bytes, the manifest recorded {size}")
        return out
    data = os.path.join(folder, "data.pt")
    if not os.path.isfile(data):
        out.append(f"{data} is missing (verl writes it after every rank's shards: the save did not finish)")
    elif not _zip_complete(data):
        out.append(f"{data} is cut short (not a whole torch archive)")
    shards: dict[tuple[str, str], dict[int, set[int]]] = {}
    for rel in _files(folder):
        m = SHARD.match(os.path.basename(rel))
        if m:
            key = (os.path.dirname(rel), m.group("kind"))
            shards.setdefault(key, {}).setdefault(int(m.group("world")), set()).add(int(m.group("rank")))
            path = os.path.join(folder, rel)
            if not _zip_complete(path):
                out.append(f"{path} is cut short (not a whole torch archive)")
    if not any(kind == "model" for _, kind in shards):
        out.append(f"{folder} holds no model shards (model_world_size_W_rank_R.pt)")
    for (sub, kind), worlds in sorted(shards.items()):
        for world, ranks in worlds.items():
            missing = sorted(set(range(world)) - ranks)
            if missing:
                out.append(f"{os.path.join(folder, sub)}: {kind} shards of ranks {missing} of {world} are missing")
    return out


def checkpoint_bytes(folder: str) -> int:
    """The size of a saved checkpoint (its manifest's total, else the files' sizes)."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as f:
            return int(json.load(f)["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return sum(os.path.getsize(os.path.join(folder, rel)) for rel in _files(folder))


def read_tracker(root: str) -> tuple[int | None, str | None]:
    """(step, None), or (None, why) when the tracker is absent, empty or not a step number."""
    path = os.path.join(root, TRACKER)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None, f"{path} does not exist"
    except OSError as e:
        return None, f"{path} is unreadable ({e})"
    if not text.isdigit():
        return None, f"{path} holds {text!r}, not a step number" if text else f"{path} is empty"
    return int(text), None


def prepare_resume(root: str, resume_mode: str, resume_from_path: str | None = None,
                   log=print) -> int:
    """Choose where a run starts, before Ray starts, and make verl load exactly that: returns the
    step resumed from (0 = from scratch).

    - ``auto``: the newest *complete* ``global_step_N`` (see :func:`problems`), whatever the tracker
      says; the tracker is rewritten (atomically) when it named another step, was empty or named a
      missing folder. Newer incomplete folders are moved aside to ``incomplete_global_step_N`` (kept,
      never deleted; the next save of step N would otherwise mix with their files). Folders exist but
      none is complete: refuse (``trainer.resume_mode=disable`` starts over).
    - ``resume_path``: that folder must be complete.
    - ``disable``: from scratch (verl's behaviour), saying so when checkpoints are there.
    """
    if resume_mode not in ("auto", "resume_path", "disable"):
        raise CheckpointError(f"trainer.resume_mode must be auto, resume_path or disable, got {resume_mode!r}")
    steps = saved_steps(root)
    if resume_mode == "disable":
        if steps:
            log(f"checkpoints: trainer.resume_mode=disable: training from scratch; the saves in {root} "
                f"(steps {steps}) are overwritten as the same steps are saved again")
        return 0
    if resume_mode == "resume_path":
        path = str(resume_from_path or "")
        m = re.search(r"global_step_(\d+)/?$", path)
        if not m:
            raise CheckpointError(f"trainer.resume_from_path must name a global_step_N folder, got {path!r}")
        bad = problems(path)
        if bad:
            raise CheckpointError(f"cannot resume from {path}: " + "; ".join(bad))
        log(f"checkpoints: resuming from {path} (trainer.resume_mode=resume_path)")
        return int(m.group(1))
    tracked, why = read_tracker(root)
    if not steps:
        if tracked is not None:
            raise CheckpointError(
                f"{os.path.join(root, TRACKER)} names step {tracked} but {root} holds no global_step_N folder; "
                f"restore the checkpoints, or delete the tracker (or set trainer.resume_mode=disable) to start over")
        return 0
    complete, broken = None, {}
    for s in reversed(steps):
        bad = problems(step_dir(root, s))
        if not bad:
            complete = s
            break
        broken[s] = bad
    if complete is None:
        detail = "; ".join(f"global_step_{s}: {b[0]}" for s, b in broken.items())
        raise CheckpointError(
            f"none of the checkpoints in {root} is complete ({detail}); refusing to train from scratch over them. "
            f"Set trainer.resume_mode=disable to start over, or trainer.default_local_dir to another folder")
    for s, bad in broken.items():
        aside = os.path.join(root, f"incomplete_global_step_{s}")
        if os.path.exists(aside):
            aside += f".{os.getpid()}"
        os.replace(step_dir(root, s), aside)
        log(f"checkpoints: global_step_{s} is incomplete ({'; '.join(bad[:3])}); moved aside to {aside}")
    if tracked != complete:
        reason = why or (f"it named step {tracked}, " + ("which is incomplete" if tracked in broken else
                                                         "which does not exist"))
        write_tracker(root, complete)
        log(f"checkpoints: {TRACKER} set to {complete} ({reason})")
    log(f"checkpoints: resuming from {step_dir(root, complete)} (the newest complete checkpoint)")
    return complete


def check_free_space(root: str, step: int, last_step: int | None, margin: float = 1.05) -> None:
    """Before saving ``global_step_<step>``: at least the last checkpoint's size (plus 5%) must be free
    on ``root``'s file system, else :class:`CheckpointError` naming both numbers."""
    if last_step is None or not os.path.isdir(step_dir(root, last_step)):
        return
    need = int(checkpoint_bytes(step_dir(root, last_step)) * margin)
    os.makedirs(root, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need > free:
        raise CheckpointError(
            f"no space left on {root} for global_step_{step}: about {need:,} bytes needed (global_step_{last_step} "
            f"took {checkpoint_bytes(step_dir(root, last_step)):,}), {free:,} free. Free space (or lower "
            f"checkpoints.keep_last), then resume: global_step_{last_step} is complete")


def describe_save_failure(root: str, step: int, error: BaseException) -> str:
    """What a failed save means for the user (verl's words for a full disk are "basic_ios::clear:
    iostream error" or "PytorchStreamWriter failed writing file")."""
    text = f"{type(error).__name__}: {error}"
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    full = (any(s in text for s in ("No space left", "ENOSPC", "errno 28", "Errno 28", "iostream error",
                                    "failed writing file", "Disk quota exceeded"))
            or (free is not None and free < 1 << 20))
    head = (f"no space left on {root} while saving global_step_{step} ({free:,} bytes free)"
            if full and free is not None
            else f"saving global_step_{step} in {root} failed")
    last = [s for s in saved_steps(root) if s < step and not problems(step_dir(root, s))]
    tail = (f"global_step_{step} is incomplete and will not be resumed from; the newest complete checkpoint is "
            f"global_step_{last[-1]}" if last else f"global_step_{step} is incomplete; no earlier complete checkpoint")
    return f"{head}: {tail}. {'Free space, then resume. ' if full else ''}Cause: {text[-1500:]}"
