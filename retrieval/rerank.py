"""Reranking: retrieve ``depth`` passages per query, score each (query, passage) pair with a cross-encoder,
return the best ``k`` in the cross-encoder's order, as Search-R1's rerank server does (its defaults:
``cross-encoder/ms-marco-MiniLM-L12-v2``, 10 retrieved, 3 returned, pairs of 32, 512 tokens).

    python -m retrieval.server --index runs/index/minilm --rerank cross-encoder/ms-marco-MiniLM-L12-v2

A passage is shown to the cross-encoder as ``(Title: TITLE) TEXT`` (the first line of ``contents`` is
the title), the string Search-R1's reranker builds. Each query is paired with its own passages only.
The score returned with ``return_scores`` is the cross-encoder's: the sigmoid of its logit for a
one-label model (what sentence-transformers' ``CrossEncoder.predict`` gives), the probability of the
last label otherwise.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from retrieval.folder import identity_of

#: Search-R1's rerank defaults (search_r1/search/reranker_server.py and retrieval_launch_hierarchical.sh)
DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L12-v2"
DEFAULT_DEPTH = 10
DEFAULT_BATCH = 32
DEFAULT_MAX_LENGTH = 512


def passage_text(doc: dict) -> str:
    """``(Title: TITLE) TEXT`` from a corpus row (``contents`` = title line, then the text)."""
    title, _, text = str(doc.get("contents", "")).partition("\n")
    return f"(Title: {title}) {text}"


class CrossEncoder:
    """A Hugging Face sequence-classification model scoring (query, passage) pairs."""

    def __init__(self, model: str, *, device: Optional[str] = None, batch_size: int = DEFAULT_BATCH,
                 max_length: int = DEFAULT_MAX_LENGTH):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1 or max_length < 8:
            raise ValueError(f"rerank batch size must be >= 1 and max length >= 8, got {batch_size}, {max_length}")
        self.name, self.batch_size, self.max_length = model, batch_size, max_length
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForSequenceClassification.from_pretrained(model).to(self.device).eval()
        except OSError as e:
            raise OSError(f"cannot load the reranker {model!r}: {e}. Give a local folder, or download it first: "
                          f"huggingface-cli download {model}") from None
        self.labels = int(self.model.config.num_labels)

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch

        out: list[float] = []
        for i in range(0, len(pairs), self.batch_size):
            chunk = pairs[i:i + self.batch_size]
            enc = self.tokenizer([q for q, _ in chunk], [p for _, p in chunk], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits = self.model(**enc).logits.float()  # [pairs, labels]
            probs = torch.sigmoid(logits[:, 0]) if self.labels == 1 else torch.softmax(logits, -1)[:, -1]
            out += probs.cpu().tolist()
        return out


class RerankingRetriever:
    """A retriever (``search(queries, k) -> [[(doc, score), ...], ...]``) that asks ``inner`` for ``depth``
    passages per query and returns the ``k`` the cross-encoder scores highest, with its scores."""

    def __init__(self, inner, reranker: CrossEncoder, depth: int = DEFAULT_DEPTH):
        if depth < 1:
            raise ValueError(f"rerank depth must be >= 1, got {depth}")
        self.inner, self.reranker, self.depth = inner, reranker, depth
        self.corpus, self.index, self.encoder = inner.corpus, inner.index, getattr(inner, "encoder", None)
        self.kind = f"{inner.kind}+rerank"
        self.identity = {**identity_of(inner), "rerank": [reranker.name, depth]}
        self.searches = 0
        self.rerank_seconds = 0.0  # time spent in the cross-encoder, over all searches

    def describe(self) -> dict:
        return {"model": self.reranker.name, "depth": self.depth, "batch_size": self.reranker.batch_size,
                "searches": self.searches, "seconds": round(self.rerank_seconds, 3)}

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[dict, float]]]:
        found = self.inner.search(queries, max(k, self.depth))
        pairs = [(q, passage_text(doc)) for q, hits in zip(queries, found) for doc, _ in hits]
        t = time.perf_counter()
        scores = self.reranker.score(pairs) if pairs else []
        self.rerank_seconds += time.perf_counter() - t
        self.searches += 1
        out, i = [], 0
        for hits in found:
            scored = [(doc, scores[i + j]) for j, (doc, _) in enumerate(hits)]
            i += len(hits)
            # stable: equal scores keep the first stage's order
            out.append(sorted(scored, key=lambda ds: -ds[1])[:k])
        return out
