"""verl's engine workers with their process group opened on gloo first.

verl opens ``cpu:gloo,<device>:<backend>`` (``cpu:gloo,cpu:gloo`` on CPU, which torch rejects)
unless a process group already exists, so these subclasses open a plain gloo group and then run
verl's own constructors unchanged.
"""

from __future__ import annotations

import os

import torch
from verl.workers.engine_workers import ActorRolloutRefWorker

from train.workers.critic_worker import CriticWorker


def init_gloo_process_group() -> None:
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="gloo", rank=int(os.environ.get("RANK", 0)),
                                             world_size=int(os.environ.get("WORLD_SIZE", 1)))


class CPUActorRolloutRefWorker(ActorRolloutRefWorker):
    def __init__(self, *args, **kwargs):
        init_gloo_process_group()
        super().__init__(*args, **kwargs)


class CPUCriticWorker(CriticWorker):
    def __init__(self, *args, **kwargs):
        init_gloo_process_group()
        super().__init__(*args, **kwargs)
