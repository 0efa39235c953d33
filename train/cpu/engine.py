"""verl's own FSDP engines for the ``cpu`` device (verl registers them for cuda/npu only).

One difference from the GPU engines: verl builds every forward-only FSDP2 module (the reference
model) with ``CPUOffloadPolicy(pin_memory=True)``. Pinned host memory is a staging area for
host<->accelerator copies; torch refuses it without an accelerator. On CPU the parameters already
live in host memory, so the CPU engines build the same policy with ``pin_memory=False``: the
reference model is sharded, offloaded and used exactly as on GPUs, only without page locking.
"""

from __future__ import annotations

import contextlib
import functools


@contextlib.contextmanager
def unpinned_cpu_offload(module):
    """Within the block, ``module.CPUOffloadPolicy(...)`` builds a policy with ``pin_memory=False``."""
    original = module.CPUOffloadPolicy
    if original is None:
        yield
        return

    @functools.wraps(original)
    def unpinned(*args, **kwargs):
        kwargs["pin_memory"] = False
        return original(*args, **kwargs)

    module.CPUOffloadPolicy = unpinned
    try:
        yield
    finally:
        module.CPUOffloadPolicy = original


def _cpu_engine(base):
    from verl.workers.engine.fsdp import transformer_impl

    class CPUEngine(base):
        def _build_fsdp_module(self, module):
            with unpinned_cpu_offload(transformer_impl):
                return super()._build_fsdp_module(module)

    CPUEngine.__name__ = CPUEngine.__qualname__ = f"CPU{base.__name__}"
    return CPUEngine


def register_fsdp_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from train.workers.value_model import ValueHeadEngine  # the critic with its configured attention, as on GPUs

    engines = EngineRegistry._engines
    for model_type, base in (("language_model", FSDPEngineWithLMHead), ("value_model", ValueHeadEngine)):
        if "cpu" not in engines.get(model_type, {}).get("fsdp", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(_cpu_engine(base))
