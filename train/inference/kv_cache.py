"""Keys/values for the batched hf engine (:mod:`train.inference.hf_engine`): a batch's cache (rows
left-padded to one length, a mask marking real tokens) and the prefix cache that keeps a finished
turn's keys/values for the trajectory's next turn.

Shapes: a cache ``KV`` is a list with one ``(keys, values)`` pair per layer, each
``[rows, kv_heads, length, head_dim]``; a mask is ``[rows, length]`` (1 = a real token).

Memory: transformers builds new cache tensors at every decode step (``DynamicLayer.update``
concatenates), so a slice of the batch's cache would keep the whole ``rows x length`` tensor of every
layer alive. What the prefix cache keeps is copied into tensors of its own first (:func:`owned`); it is
bounded in bytes and in count (least recently used dropped first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

import torch

KV = list  # per layer: (keys, values), each [rows, kv_heads, length, head_dim]


def pad_left(kv: KV, n: int) -> KV:
    """``kv`` with ``n`` zero positions in front of every row (``length`` grows by ``n``)."""
    if n <= 0:
        return kv
    out = []
    for k, v in kv:
        zk = k.new_zeros(k.shape[0], k.shape[1], n, k.shape[3])
        zv = v.new_zeros(v.shape[0], v.shape[1], n, v.shape[3])
        out.append((torch.cat([zk, k], 2), torch.cat([zv, v], 2)))
    return out


def nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def owned(kv: KV) -> KV:
    """``kv`` in tensors that hold exactly their own elements (a view of a larger tensor is copied)."""
    def own(t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
            return t
        return t.contiguous().clone()

    return [(own(k), own(v)) for k, v in kv]


def join(kv: KV, mask: Optional[torch.Tensor], row_kv: KV, row_len: int, device) -> tuple[KV, torch.Tensor]:
    """The batch cache with one more row (its ``row_len`` tokens), the shorter side left-padded;
    ``kv``/``mask`` empty/None for an empty batch."""
    row_mask = torch.ones(1, row_len, dtype=torch.long, device=device)
    if mask is None:
        return row_kv, row_mask
    T = mask.shape[1]
    if row_len < T:
        row_kv = pad_left(row_kv, T - row_len)
        row_mask = torch.cat([torch.zeros(1, T - row_len, dtype=torch.long, device=device), row_mask], 1)
    elif row_len > T:
        kv = pad_left(kv, row_len - T)
        mask = torch.cat([torch.zeros(mask.shape[0], row_len - T, dtype=torch.long, device=device), mask], 1)
    kv = [(torch.cat([k, rk], 0), torch.cat([v, rv], 0)) for (k, v), (rk, rv) in zip(kv, row_kv)]
    return kv, torch.cat([mask, row_mask], 0)


def row(kv: KV, i: int, pad: int) -> KV:
    """Row ``i`` of the batch cache without its ``pad`` leading padding positions (views)."""
    return [(k[i:i + 1, :, pad:], v[i:i + 1, :, pad:]) for k, v in kv]


def keep_rows(kv: KV, mask: torch.Tensor, keep: list[int], lengths: list[int]) -> tuple[KV, torch.Tensor]:
    """The batch cache of the rows ``keep`` (their token counts ``lengths``), with the leading columns
    that are padding in every one of them dropped."""
    idx = torch.tensor(keep, device=mask.device)
    kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in kv]
    mask = mask.index_select(0, idx)
    lead = mask.shape[1] - max(lengths)
    if lead > 0:
        kv = [(k[:, :, lead:], v[:, :, lead:]) for k, v in kv]
        mask = mask[:, lead:]
    return kv, mask


class PrefixCache:
    """Per ``request_id`` (a trajectory), the tokens fed so far and their keys/values, kept between its
    turns. Thread-safe; bounded by ``max_entries`` and ``max_bytes`` (least recently used dropped)."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = int(max_entries), int(max_bytes)
        self.bytes = 0
        self.evicted = self.released = 0
        self._kept: "OrderedDict[str, tuple[list[int], KV]]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self):
        with self._lock:
            return iter(list(self._kept))

    def items(self) -> list[tuple[str, tuple[list[int], KV]]]:
        """``(request_id, (tokens, kv))`` of every entry, least recently used first (a copy)."""
        with self._lock:
            return list(self._kept.items())

    def take(self, rid: Optional[str], prompt: list[int]) -> tuple[int, KV]:
        """Remove ``rid``'s entry; return how many leading tokens of ``prompt`` it covers (at most all
        but the last, whose logits are needed) and their keys/values (views of the kept tensors)."""
        if rid is None:
            return 0, []
        with self._lock:
            kept = self._kept.pop(rid, None)
            if kept is not None:
                self.bytes -= nbytes(kept[1])
        if kept is None:
            return 0, []
        tokens, kv = kept
        n = 0
        for a, b in zip(tokens, prompt):
            if a != b:
                break
            n += 1
        keep = min(n, len(prompt) - 1)  # feed at least one token, for its logits
        return keep, ([(k[:, :, :keep], v[:, :, :keep]) for k, v in kv] if keep else [])

    def put(self, rid: str, tokens: list[int], kv: KV) -> None:
        """Keep ``kv`` (copied into tensors of its own) for ``rid``'s next turn, then evict to the bounds."""
        kv = owned(kv)
        size = nbytes(kv)
        with self._lock:
            old = self._kept.pop(rid, None)
            if old is not None:
                self.bytes -= nbytes(old[1])
            if size <= self.max_bytes:
                self._kept[rid] = (tokens, kv)
                self.bytes += size
            while self._kept and (len(self._kept) > self.max_entries or self.bytes > self.max_bytes):
                _, (_, gone) = self._kept.popitem(last=False)
                self.bytes -= nbytes(gone)
                self.evicted += 1

    def release(self, rid: str) -> None:
        with self._lock:
            kept = self._kept.pop(rid, None)
            if kept is not None:
                self.bytes -= nbytes(kept[1])
                self.released += 1

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self.bytes = 0
