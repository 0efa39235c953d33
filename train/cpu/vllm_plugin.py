"""A vLLM general plugin (entry point group ``vllm.general_plugins``) for verl's weight sync on
vLLM's CPU build. vLLM loads it in every one of its processes (engine core, spawned workers); it does
nothing unless vLLM runs on the CPU platform.

What it fixes: on CPU, ``UnquantizedLinearMethod.process_weights_after_loading`` calls
``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``, which packs the weight for the CPU GEMM
kernel and replaces ``layer.weight`` by an empty parameter without ``weight_loader``. verl syncs the
trainer's weights into vLLM after every step with ``model.load_weights``, which needs that
``weight_loader``: the first sync raised ``AttributeError``, the engine core died and the trainer hung.
Keeping the weight (``remove_weight=False``, what vLLM itself does for embeddings) lets every sync load;
verl re-runs ``process_weights_after_loading`` after each sync, so the packed kernels follow the new
weights. The cost is one extra copy of the linear weights in host memory.
"""

from __future__ import annotations

import functools

_PATCHED = "_search_r1_keeps_weight"


def register() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def keep_weight(layer, remove_weight: bool):
        return original(layer, remove_weight=False)

    setattr(keep_weight, _PATCHED, True)
    utils.dispatch_cpu_unquantized_gemm = keep_weight
