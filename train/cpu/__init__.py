"""Running verl's real training loop on CPU (``VERL_PLATFORM=cpu``): a CPU platform on gloo,
verl's own FSDP engine registered for the ``cpu`` device, and an ``hf`` rollout (the batched
transformers engine of train/inference/hf_engine.py) behind verl's server-replica interface.

Nothing here is active unless the config asks for it: the platform only when ``VERL_PLATFORM=cpu``,
the rollout only with ``actor_rollout_ref.rollout.name=hf``. The GPU path is unchanged.
"""

import os


def register() -> None:
    """Register the CPU pieces with verl's registries (idempotent)."""
    from train.cpu import hf_rollout as rollout
    from train.cpu import platform  # noqa: F401  (PlatformRegistry "cpu")

    rollout.register()
    from train.cpu.engine import register_fsdp_for_cpu

    register_fsdp_for_cpu()


def enabled() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"
