"""verl's own FSDP engines, registered for the ``cpu`` device (verl registers them for cuda/npu only)."""

from __future__ import annotations


def register_fsdp_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    engines = EngineRegistry._engines
    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if "cpu" not in engines.get(model_type, {}).get("fsdp", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(cls)
