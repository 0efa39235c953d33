"""SIGTERM in the driver, as Slurm and Kubernetes send it: exit 143 after shutting Ray down; with
``+trainer.save_on_sigterm=true`` the step in progress finishes and is saved first (the trainer sees
the flag file :data:`STOP_FLAG` in the checkpoint folder; a second SIGTERM stops at once)."""

from __future__ import annotations

import os

import ray
from omegaconf import DictConfig

STOP_FLAG = ".stop_requested"  # in trainer.default_local_dir: the driver got SIGTERM with trainer.save_on_sigterm
COLLAPSE_FLAG = ".collapse_stop"  # in trainer.default_local_dir: the collapse warning stopped the run (its text)


class StopAfterSave(Exception):
    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


def stop_requested(root: str) -> bool:
    return os.path.exists(os.path.join(root, STOP_FLAG))


def on_sigterm(config: DictConfig, root: str, got: list | None = None) -> list:
    """Handle SIGTERM in the driver (Ray's own handler exits 1, or aborts with 134 and a stack dump,
    where Slurm and Kubernetes expect 143): abandon the step, shut Ray down, exit 143. With
    ``+trainer.save_on_sigterm=true`` the step in progress finishes and is saved first (a second
    SIGTERM abandons it). Returns the list that records the signal."""
    import signal

    got = [] if got is None else got
    save = bool(config.trainer.get("save_on_sigterm", False))

    def handler(signum, frame):
        got.append(signum)
        if save and len(got) == 1:
            os.makedirs(root, exist_ok=True)
            open(os.path.join(root, STOP_FLAG), "w").close()
            print("SIGTERM: finishing this step and saving its checkpoint (trainer.save_on_sigterm=true), then "
                  "exiting 143; a second SIGTERM stops at once", flush=True)
            return
        raise KeyboardInterrupt  # what ray.get is interrupted by cleanly

    signal.signal(signal.SIGTERM, handler)
    return got


def stop_after_sigterm(root: str) -> None:
    from train.trainer import checkpoint_store

    step, _ = checkpoint_store.read_tracker(root)
    print("SIGTERM: stopped; the newest checkpoint is "
          + (f"global_step_{step} in {root}: rerun the same command to resume from it" if step else
             "none: rerun to start again"), flush=True)
    try:
        ray.shutdown()
    finally:
        raise SystemExit(143)
