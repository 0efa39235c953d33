"""A training checkpoint given where a model goes (``python -m train.evaluate --model``, ``scripts/evaluate.sh
CKPT``): verl saves ``global_step_N/actor/`` as FSDP shards, which transformers cannot load. Such a folder
(``global_step_N``, its ``actor/`` or ``actor/huggingface/``) is merged once into ``global_step_N/hf`` with
the merge of ``--checkpoints`` (:func:`train.evaluation.checkpoint_sweep.merge`), saying so, and that folder
is evaluated; a later run finds ``hf/`` and uses it. What cannot be merged is refused with the command that
merges it by hand.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from train.errors import CheckpointError


def step_folder(model: str) -> Optional[Path]:
    """The ``global_step_N`` folder a model path points into (the folder, its ``actor/`` or
    ``actor/huggingface/``), or None when it is not a verl checkpoint."""
    path = Path(os.path.expanduser(str(model)))
    if not path.is_dir():
        return None
    if path.name == "huggingface" and path.parent.name == "actor":
        path = path.parent.parent
    elif path.name == "actor":
        path = path.parent
    if (path / "actor").is_dir() and not (path / "config.json").is_file():
        return path
    return None


def merge_command(step: Path, target: Path) -> str:
    return (f"python -m verl.model_merger merge --backend fsdp --local_dir {step / 'actor'} "
            f"--target_dir {target}")


def model_folder(model: Optional[str], log=None) -> Optional[str]:
    """``model`` unchanged unless it is a verl checkpoint: then its merged ``global_step_N/hf``, merged here
    the first time."""
    from train.evaluation.checkpoint_sweep import merge
    from train.trainer import checkpoint_store

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    step = step_folder(model) if model else None
    if step is None:
        return model
    target = step / "hf"
    if (target / "config.json").is_file():
        log(f"{model} is a verl checkpoint: evaluating its merged model {target}")
        return str(target)
    wrong = checkpoint_store.problems(str(step))
    if wrong:
        raise CheckpointError(f"{model} is a verl checkpoint that is not complete ({wrong[0]}): evaluate a "
                              f"complete global_step_N (python -m train.checkpoints {step} says why)")
    log(f"{model} is a verl checkpoint (FSDP shards, which transformers cannot load): merging it once into "
        f"{target} (later runs use that folder) ...")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".hf-merging-", dir=step))
    except OSError as e:
        raise CheckpointError(f"cannot write the merged model beside {step} ({e}); merge it elsewhere and pass "
                              f"that folder: {merge_command(step, Path('DIR'))}") from None
    try:
        merge(step, tmp / "hf")
        os.replace(tmp / "hf", target)
    except (RuntimeError, OSError) as e:
        raise CheckpointError(f"merging {step / 'actor'} failed: {e}\nmerge it by hand with: "
                              f"{merge_command(step, target)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"merged: {target}")
    return str(target)


def results_name(model: str) -> str:
    """The default results file's name of a model: ``RUN-global_step_N`` for a checkpoint (not ``hf``)."""
    step = step_folder(model)
    if step is not None:
        return f"{step.resolve().parent.name}-{step.name}"
    return Path(str(model).rstrip("/")).name
