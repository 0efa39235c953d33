"""A batching transformers engine for ``--backend hf`` (``infer.py``, the evaluator): concurrent
requests are decoded together, and the KV cache of a trajectory is kept between its turns.

The agent loop calls ``generate`` once per turn with the whole context so far (prompt, earlier turns,
observations) and the same ``request_id`` for every turn of a trajectory. Plain ``model.generate``
re-reads all of it each turn, one question at a time; here

- the keys/values of the tokens a request already fed stay in an LRU keyed by ``request_id``; the
  next turn feeds only what follows the longest common prefix (the observation and what comes after);
- requests in flight are decoded as one batch (continuous batching: a request joins at the next
  step and leaves when it stops). Rows of different lengths are left-padded in the batch's cache
  and masked; every row keeps its own positions, so a row's logits do not depend on its neighbours
  beyond floating-point rounding.

Memory: transformers builds new cache tensors at every decode step (``DynamicLayer.update`` concatenates),
so a slice of the batch's cache would keep the whole ``rows x length`` tensor of every layer alive. A
finished row's keys/values are therefore copied into tensors of their own before they are kept; the kept
caches are bounded in bytes (``max_cached_bytes``; least recently used dropped first) and in count, and a
trajectory's cache is dropped when it ends (:meth:`HFBatchedServerManager.release`, called by the agent
loop). An out-of-memory drops every kept cache and asks the batch's requests again once; a sticky device
fault (``torch.AcceleratorError``) marks the engine dead (:class:`train.inference.EngineDead`), so the
evaluator moves its questions to another engine.

Greedy output equals ``model.generate``'s (tests/test_hf_engine_on_cpu.py); the speed-up is in
bench/RESULTS.md (``python bench/bench_hf_engine.py``). Sampling (temperature, top_p), stop strings
(checked on the decoded tail after every token, as :class:`train.hf_rollout.HFServerManager` does)
and per-token log-probs are supported. The CPU training rollout (``rollout.name=hf``,
train/cpu/rollout.py) uses it too, dropping the kept caches at every weight update.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

KV = list  # per layer: (keys, values), each [rows, kv_heads, length, head_dim]


@dataclass
class _Request:
    rid: Optional[str]
    prompt: list[int]
    params: dict
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    retried: bool = False  # asked again once after an out-of-memory


@dataclass
class _Row:
    req: _Request
    tokens: list[int]  # tokens whose keys/values are in the cache
    next_token: int  # sampled, not fed yet
    max_tokens: int
    temperature: float
    top_p: float
    stops: list[str]
    want_logprobs: bool
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def _pad_left(kv: KV, n: int) -> KV:
    if n <= 0:
        return kv
    out = []
    for k, v in kv:
        zk = k.new_zeros(k.shape[0], k.shape[1], n, k.shape[3])
        zv = v.new_zeros(v.shape[0], v.shape[1], n, v.shape[3])
        out.append((torch.cat([zk, k], 2), torch.cat([zv, v], 2)))
    return out


def _nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _owned(kv: KV) -> KV:
    """``kv`` in tensors that hold exactly their own elements (a view of a larger tensor is copied)."""
    def own(t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
            return t
        return t.contiguous().clone()

    return [(own(k), own(v)) for k, v in kv]


#: Default bound of the kept caches: 4 GiB on a GPU (Qwen2.5-3B in bf16 keeps 36 KiB per token: ~115
#: two-thousand-token trajectories), 512 MiB on CPU.
DEFAULT_CACHED_BYTES = {"cuda": 4 << 30, "cpu": 512 << 20}


class HFBatchedServerManager:
    def __init__(self, model, tokenizer, device: Optional[str] = None, seed: Optional[int] = 0,
                 max_batch: int = 32, max_cached: int = 512, max_cached_bytes: Optional[int] = None):
        layer_types = getattr(model.config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types) or getattr(model.config, "use_sliding_window", False):
            raise ValueError("the batched hf engine handles full-attention models only (this one has sliding "
                             "window layers)")
        self.model, self.tokenizer = model, tokenizer
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.max_batch, self.max_cached = max_batch, max_cached
        self.max_cached_bytes = int(max_cached_bytes if max_cached_bytes is not None else
                                    DEFAULT_CACHED_BYTES["cuda" if self.device.type == "cuda" else "cpu"])
        self.kept_bytes = 0
        self._dead: Optional[str] = None
        self._gen = torch.Generator(device="cpu")
        if seed is not None:
            self._gen.manual_seed(seed)
        self._cond = threading.Condition()
        self._incoming: deque[_Request] = deque()
        self._kept: "OrderedDict[str, tuple[list[int], KV]]" = OrderedDict()  # request_id -> (tokens, kv)
        self._kept_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.calls = 0
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "decode_rows": 0,
                      "evicted": 0, "released": 0, "oom_retries": 0}

    @classmethod
    def from_pretrained(cls, path: str, device: Optional[str] = None, dtype: Optional[str] = None, seed: int = 0,
                        **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from train.cuda_probe import default_device

        device = device or default_device()
        torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        return cls(model, tok, device, seed, **kwargs)

    # -- the server-manager interface ---------------------------------------------------------

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **kwargs):
        if not prompt_ids:
            raise ValueError("generate: empty prompt")
        loop = asyncio.get_running_loop()
        req = _Request(None if request_id is None else str(request_id), list(prompt_ids), dict(sampling_params),
                       loop, loop.create_future())
        with self._cond:
            if self._dead:
                from train.inference import EngineDead

                raise EngineDead(self._dead)
            if self._closed:
                raise RuntimeError("the hf engine is closed")
            self.calls += 1
            self._incoming.append(req)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return await req.future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    # -- the engine thread --------------------------------------------------------------------

    def _serve(self) -> None:
        batch: list[_Row] = []
        kv: KV = []
        mask = None  # [rows, length] 1 = a real token
        while True:
            with self._cond:
                while not self._incoming and not batch and not self._closed:
                    self._cond.wait()
                if self._closed and not batch and not self._incoming:
                    return
                admit = []
                while self._incoming and len(batch) + len(admit) < self.max_batch:
                    admit.append(self._incoming.popleft())
            try:
                with torch.inference_mode():
                    for req in admit:
                        try:
                            row, row_kv = self._prefill(req)
                        except Exception as e:  # noqa: BLE001  (this request fails or is retried; the batch goes on)
                            self._recover(e, [req])
                            continue
                        if row is None:
                            continue
                        batch, kv, mask = self._join(batch, kv, mask, row, row_kv)
                    if batch:
                        batch, kv, mask = self._step(batch, kv, mask)
            except Exception as e:  # noqa: BLE001  (fail these requests, keep serving)
                reqs = [r.req for r in batch] + [q for q in admit if not q.future.done()]
                batch, kv, mask = [], [], None
                self._recover(e, reqs)

    def _recover(self, e: BaseException, reqs: list[_Request]) -> None:
        """After a failed step: out of memory -> drop the kept caches and ask each request again (once);
        a device fault -> the engine is dead; anything else -> these requests fail."""
        accel = getattr(torch, "AcceleratorError", None)
        if isinstance(e, torch.OutOfMemoryError):
            self.clear_cache()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            again = [q for q in reqs if not q.retried]
            for q in again:
                q.retried = True
            self.stats["oom_retries"] += len(again)
            with self._cond:
                self._incoming.extendleft(reversed(again))
            reqs = [q for q in reqs if q not in again]
        elif accel is not None and isinstance(e, accel):
            from train.inference import EngineDead

            self._dead = f"the hf engine's device failed ({type(e).__name__}: {str(e).splitlines()[0]})"
            self.clear_cache()
            e = EngineDead(self._dead)
            with self._cond:
                reqs += list(self._incoming)
                self._incoming.clear()
        for q in reqs:
            self._resolve(q, error=e)

    def _resolve(self, req: _Request, result=None, error: Optional[BaseException] = None) -> None:
        def done():
            if req.future.done():
                return
            if error is not None:
                req.future.set_exception(error)
            else:
                req.future.set_result(result)

        req.loop.call_soon_threadsafe(done)

    def _sample(self, logits: torch.Tensor, temperature: float, top_p: float) -> tuple[int, float]:
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
        tok = int(torch.multinomial(probs.cpu(), 1, generator=self._gen))
        return tok, float(torch.log_softmax(scaled, -1)[tok])

    def _forward(self, ids: torch.Tensor, kv: KV, positions: torch.Tensor, mask: Optional[torch.Tensor]):
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        out = self.model(input_ids=ids, past_key_values=cache, position_ids=positions, attention_mask=mask,
                         use_cache=True)
        new_kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out.logits[:, -1, :], new_kv

    def _prefill(self, req: _Request) -> tuple[Optional[_Row], KV]:
        sp = req.params
        max_tokens = int(sp.get("max_tokens") or sp.get("max_new_tokens") or 256)
        temperature = float(sp.get("temperature", 1.0) or 0.0)
        row = _Row(req, tokens=list(req.prompt), next_token=-1, max_tokens=max_tokens, temperature=temperature,
                   top_p=float(sp.get("top_p", 1.0) or 1.0), stops=list(sp.get("stop") or []),
                   want_logprobs=bool(sp.get("logprobs")))
        keep, kv = 0, []
        with self._kept_lock:
            kept = self._kept.pop(req.rid, None) if req.rid is not None else None
            if kept is not None:
                self.kept_bytes -= _nbytes(kept[1])
        if kept is not None:
            tokens, kv_all = kept
            n = 0
            for a, b in zip(tokens, req.prompt):
                if a != b:
                    break
                n += 1
            keep = min(n, len(req.prompt) - 1)  # feed at least one token, for its logits
            kv = [(k[:, :, :keep], v[:, :, :keep]) for k, v in kv_all] if keep else []
        feed = req.prompt[keep:]
        ids = torch.tensor([feed], device=self.device)
        positions = torch.arange(keep, len(req.prompt), device=self.device).unsqueeze(0)
        logits, kv = self._forward(ids, kv, positions, None)
        self.stats["prefill_tokens"] += len(feed)
        self.stats["reused_tokens"] += keep
        if self._take(row, logits[0]):
            self._finish(row, kv)
            return None, []
        return row, kv

    def _take(self, row: _Row, logits: torch.Tensor) -> bool:
        """Sample the row's next token; True when the row stops with it."""
        tok, lp = self._sample(logits, row.temperature, row.top_p)
        row.generated.append(tok)
        if row.want_logprobs:
            row.logprobs.append(lp)
        row.next_token = tok
        if tok == self.tokenizer.eos_token_id or len(row.generated) >= row.max_tokens:
            return True
        if row.stops:
            tail = self.tokenizer.decode(row.generated[-32:])
            return any(s in tail for s in row.stops)
        return False

    def _finish(self, row: _Row, kv: KV) -> None:
        from verl.workers.rollout.replica import TokenOutput

        if row.req.rid is not None:
            kv = _owned(kv)
            size = _nbytes(kv)
            with self._kept_lock:
                old = self._kept.pop(row.req.rid, None)
                if old is not None:
                    self.kept_bytes -= _nbytes(old[1])
                if size <= self.max_cached_bytes:
                    self._kept[row.req.rid] = (row.tokens, kv)
                    self.kept_bytes += size
                while self._kept and (len(self._kept) > self.max_cached or self.kept_bytes > self.max_cached_bytes):
                    _, (_, gone) = self._kept.popitem(last=False)
                    self.kept_bytes -= _nbytes(gone)
                    self.stats["evicted"] += 1
        self._resolve(row.req, TokenOutput(token_ids=list(row.generated),
                                           log_probs=list(row.logprobs) if row.want_logprobs else None,
                                           stop_reason="completed"))

    def _join(self, batch: list[_Row], kv: KV, mask, row: _Row, row_kv: KV):
        L = len(row.tokens)
        row_mask = torch.ones(1, L, dtype=torch.long, device=self.device)
        if not batch:
            return [row], row_kv, row_mask
        T = mask.shape[1]
        if L < T:
            row_kv = _pad_left(row_kv, T - L)
            row_mask = torch.cat([torch.zeros(1, T - L, dtype=torch.long, device=self.device), row_mask], 1)
        elif L > T:
            kv = _pad_left(kv, L - T)
            mask = torch.cat([torch.zeros(mask.shape[0], L - T, dtype=torch.long, device=self.device), mask], 1)
        kv = [(torch.cat([k, rk], 0), torch.cat([v, rv], 0)) for (k, v), (rk, rv) in zip(kv, row_kv)]
        return batch + [row], kv, torch.cat([mask, row_mask], 0)

    def _step(self, batch: list[_Row], kv: KV, mask):
        ids = torch.tensor([[r.next_token] for r in batch], device=self.device)
        positions = torch.tensor([[len(r.tokens)] for r in batch], device=self.device)
        mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=torch.long, device=self.device)], 1)
        logits, kv = self._forward(ids, kv, positions, mask)
        self.stats["decode_steps"] += 1
        self.stats["decode_rows"] += len(batch)
        keep = []
        T = mask.shape[1]
        for i, r in enumerate(batch):
            r.tokens.append(r.next_token)
            if self._take(r, logits[i]):
                pad = T - len(r.tokens)
                self._finish(r, [(k[i:i + 1, :, pad:], v[i:i + 1, :, pad:]) for k, v in kv])
            else:
                keep.append(i)
        if len(keep) == len(batch):
            return batch, kv, mask
        if not keep:
            return [], [], None
        idx = torch.tensor(keep, device=self.device)
        batch = [batch[i] for i in keep]
        kv = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in kv]
        mask = mask.index_select(0, idx)
        lead = T - max(len(r.tokens) for r in batch)  # columns that are padding in every row left
        if lead > 0:
            kv = [(k[:, :, lead:], v[:, :, lead:]) for k, v in kv]
            mask = mask[:, lead:]
        return batch, kv, mask

    def clear_cache(self) -> None:
        """Forget every kept KV cache (after a weight update they belong to the old weights)."""
        with self._kept_lock:
            self._kept.clear()
            self.kept_bytes = 0

    def release(self, request_id) -> None:
        """The trajectory ``request_id`` has ended: its kept cache is dropped (no later turn will use it)."""
        with self._kept_lock:
            kept = self._kept.pop(str(request_id), None)
            if kept is not None:
                self.kept_bytes -= _nbytes(kept[1])
                self.stats["released"] += 1

    def describe(self) -> dict[str, Any]:
        return dict(self.stats, kept=len(self._kept), kept_bytes=self.kept_bytes)
