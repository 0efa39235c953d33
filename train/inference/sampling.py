"""Sampling parameters as the agent loop sends them (vLLM's names: ``max_tokens``, ``temperature``,
``top_p``, ``stop``, ``logprobs``), read in one place for every transformers backend
(:mod:`train.inference.hf_engine`, :mod:`train.inference.hf_generate`, the CPU rollout), and the
one-token sampler they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

#: new tokens when a request names no ``max_tokens`` (the agent loop always does)
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stops: tuple[str, ...] = ()
    logprobs: bool = False

    @classmethod
    def from_params(cls, sp: dict[str, Any]) -> "Sampling":
        """vLLM's defaults for what is absent (temperature 1, top_p 1); ``max_new_tokens`` (transformers'
        name) is read too. A value of None or 0 for ``temperature`` means greedy."""
        return cls(max_tokens=int(sp.get("max_tokens") or sp.get("max_new_tokens") or DEFAULT_MAX_TOKENS),
                   temperature=float(sp.get("temperature", 1.0) or 0.0),
                   top_p=float(sp.get("top_p", 1.0) or 1.0),
                   stops=tuple(sp.get("stop") or ()),
                   logprobs=bool(sp.get("logprobs")))


def sample(logits, temperature: float, top_p: float, generator: Optional[Any] = None) -> tuple[int, float]:
    """One token from ``logits`` ``[vocab]``: argmax at temperature 0, else nucleus sampling (the smallest
    set of tokens whose probability reaches ``top_p``) at ``temperature``. Returns the token and its
    log-probability under the distribution it was drawn from (temperature applied, before top-p)."""
    import torch

    logits = logits.float()
    if temperature <= 0:
        tok = int(torch.argmax(logits))
        return tok, float(torch.log_softmax(logits, -1)[tok])
    scaled = logits / temperature
    probs = torch.softmax(scaled, -1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, -1) - sp < top_p  # the smallest prefix whose mass reaches top_p
        filtered = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
        probs = filtered / filtered.sum()
    tok = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    return tok, float(torch.log_softmax(scaled, -1)[tok])


def load_model(path: str, device: Optional[str] = None, dtype: Optional[str] = None):
    """``(model, tokenizer, device)`` of a local folder or hub id for a transformers backend: bf16 on a
    GPU, fp32 on CPU unless ``dtype`` names one; the device defaults to a GPU when one is visible,
    asked without initialising CUDA here (:func:`train.inference.cuda_probe.default_device`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.inference.cuda_probe import default_device

    device = device or default_device()
    torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    return model, tok, device
