"""The PPO critic with the attention backend its config names.

verl 0.9.1 builds the critic (``model_type="value_model"``) with
``verl.utils.model.load_valuehead_model``, which passes ``attn_implementation="flash_attention_2"``
to ``from_pretrained`` explicitly, overriding ``critic.model.override_config.attn_implementation``.
Without flash-attn (no binary wheel on PyPI) transformers raises, and verl's ``except BaseException``
turns that into "please install trl". The actor and reference model read the configured backend
from ``hf_config`` and are not affected.

:class:`ValueHeadEngine` is verl's own FSDP value-head engine; while it builds its module,
verl's loader is replaced by :func:`load_value_model`, which loads the same
``AutoModelForTokenClassification`` (one label: the value) with the attention implementation of the
critic's ``hf_config`` (``sdpa`` in the presets). It is registered with verl's ``EngineRegistry``
for NVIDIA GPUs under the vendor key, which verl looks up before the device key it registers its
own engine under (by :class:`train.workers.critic_worker.CriticWorker`, in the critic's process); the CPU engine
(:mod:`train.cpu.engine`) derives from it too. verl's files are not touched.
"""

from __future__ import annotations

import contextlib

from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead


def load_value_model(local_path, torch_dtype, model_config, trust_remote_code):
    """verl's ``load_valuehead_model`` signature; the attention backend comes from ``model_config``."""
    from transformers import AutoModelForTokenClassification

    attn = getattr(model_config, "_attn_implementation", None) or "sdpa"
    try:
        return AutoModelForTokenClassification.from_pretrained(
            pretrained_model_name_or_path=local_path, torch_dtype=torch_dtype, config=model_config,
            attn_implementation=attn, trust_remote_code=trust_remote_code)
    except ValueError as e:  # e.g. an architecture without a token-classification head
        arch = (getattr(model_config, "architectures", None) or ["?"])[0]
        raise RuntimeError(f"cannot build the PPO critic from {local_path} ({arch}) as a token-classification "
                           f"model with attn_implementation={attn!r}: {e}") from e


@contextlib.contextmanager
def configured_value_loader():
    """Within the block, ``verl.utils.model.load_valuehead_model`` is :func:`load_value_model`
    (verl's engine imports it from that module when it builds the critic)."""
    import verl.utils.model as verl_model

    original = verl_model.load_valuehead_model
    verl_model.load_valuehead_model = load_value_model
    try:
        yield
    finally:
        verl_model.load_valuehead_model = original


class ValueHeadEngine(FSDPEngineWithValueHead):
    """verl's FSDP value-head engine, building its module with :func:`load_value_model`."""

    def _build_module(self):
        with configured_value_loader():
            return super()._build_module()


def register() -> None:
    """:class:`ValueHeadEngine` for NVIDIA GPUs under ``(cuda, nvidia)``: verl's lookup tries the
    vendor key before the ``cuda`` key of its own engine. Idempotent."""
    for backend in ("fsdp", "fsdp2"):
        registry = EngineRegistry._engines.setdefault("value_model", {}).setdefault(backend, {})
        if ("cuda", "nvidia") not in registry:
            EngineRegistry.register(model_type="value_model", backend=backend, device="cuda",
                                    vendor="nvidia")(ValueHeadEngine)
