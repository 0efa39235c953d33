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
fault (``torch.AcceleratorError``) marks the engine dead (:class:`train.errors.EngineDead`), so the
evaluator moves its questions to another engine.

Greedy output equals ``model.generate``'s
(tests/evaluation/test_eval_engines_on_cpu.py::test_hf_engine_same_answers_as_generate_and_reuses_the_cache);
the speed-up is in
bench/RESULTS.md (``python bench/bench_eval.py --parts hf_engine``). Sampling (temperature, top_p), stop strings
(checked on the decoded tail after every token, as :class:`train.inference.hf_generate.HFServerManager` does)
and per-token log-probs are supported. The CPU training rollout (``rollout.name=hf``,
train/cpu/hf_rollout.py) uses it too, dropping the kept caches at every weight update.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from train.inference import kv_cache
from train.inference.kv_cache import KV, PrefixCache
from train.inference.sampling import Sampling, sample


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


def end_of_turn_token_ids(model, tokenizer) -> frozenset[int]:
    """The ids a generation stops at, as vLLM stops: the tokenizer's EOS and every ``eos_token_id`` of the
    model's generation config (Qwen2.5-Instruct: ``<|im_end|>`` and ``<|endoftext|>``); no family's
    convention is assumed."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = {tokenizer.eos_token_id} | set(eos if isinstance(eos, (list, tuple)) else [eos])
    return frozenset(int(i) for i in ids if i is not None)


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
        self.eos_ids = end_of_turn_token_ids(model, tokenizer)
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.max_batch, self.max_cached = max_batch, max_cached
        self.max_cached_bytes = int(max_cached_bytes if max_cached_bytes is not None else
                                    DEFAULT_CACHED_BYTES["cuda" if self.device.type == "cuda" else "cpu"])
        self.cache = PrefixCache(max_cached, self.max_cached_bytes)  # request_id -> (tokens, kv), between turns
        self._dead: Optional[str] = None
        self._gen = torch.Generator(device="cpu")
        if seed is not None:
            self._gen.manual_seed(seed)
        self._cond = threading.Condition()
        self._incoming: deque[_Request] = deque()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.calls = 0
        self._stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "decode_rows": 0, "oom_retries": 0}

    @property
    def kept_bytes(self) -> int:
        return self.cache.bytes

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._stats, evicted=self.cache.evicted, released=self.cache.released)

    @classmethod
    def from_pretrained(cls, path: str, device: Optional[str] = None, dtype: Optional[str] = None, seed: int = 0,
                        **kwargs):
        from train.inference.sampling import load_model

        model, tok, device = load_model(path, device, dtype)
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
                from train.errors import EngineDead

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
            self._stats["oom_retries"] += len(again)
            with self._cond:
                self._incoming.extendleft(reversed(again))
            reqs = [q for q in reqs if q not in again]
        elif accel is not None and isinstance(e, accel):
            from train.errors import EngineDead

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

    def _forward(self, ids: torch.Tensor, kv: KV, positions: torch.Tensor, mask: Optional[torch.Tensor]):
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        out = self.model(input_ids=ids, past_key_values=cache, position_ids=positions, attention_mask=mask,
                         use_cache=True)
        new_kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out.logits[:, -1, :], new_kv

    def _prefill(self, req: _Request) -> tuple[Optional[_Row], KV]:
        s = Sampling.from_params(req.params)
        row = _Row(req, tokens=list(req.prompt), next_token=-1, max_tokens=s.max_tokens, temperature=s.temperature,
                   top_p=s.top_p, stops=list(s.stops), want_logprobs=s.logprobs)
        keep, kv = self.cache.take(req.rid, req.prompt)
        feed = req.prompt[keep:]
        ids = torch.tensor([feed], device=self.device)  # [1, fed]
        positions = torch.arange(keep, len(req.prompt), device=self.device).unsqueeze(0)
        logits, kv = self._forward(ids, kv, positions, None)
        self._stats["prefill_tokens"] += len(feed)
        self._stats["reused_tokens"] += keep
        if self._take(row, logits[0]):
            self._finish(row, kv)
            return None, []
        return row, kv

    def _take(self, row: _Row, logits: torch.Tensor) -> bool:
        """Sample the row's next token; True when the row stops with it."""
        tok, lp = sample(logits, row.temperature, row.top_p, self._gen)
        row.generated.append(tok)
        if row.want_logprobs:
            row.logprobs.append(lp)
        row.next_token = tok
        if tok in self.eos_ids or len(row.generated) >= row.max_tokens:
            return True
        if row.stops:
            tail = self.tokenizer.decode(row.generated[-32:])
            return any(s in tail for s in row.stops)
        return False

    def _finish(self, row: _Row, kv: KV) -> None:
        from verl.workers.rollout.replica import TokenOutput

        if row.req.rid is not None:
            self.cache.put(row.req.rid, row.tokens, kv)
        self._resolve(row.req, TokenOutput(token_ids=list(row.generated),
                                           log_probs=list(row.logprobs) if row.want_logprobs else None,
                                           stop_reason="completed"))

    def _join(self, batch: list[_Row], kv: KV, mask, row: _Row, row_kv: KV):
        kv, mask = kv_cache.join(kv if batch else [], mask if batch else None, row_kv, len(row.tokens), self.device)
        return batch + [row], kv, mask

    def _step(self, batch: list[_Row], kv: KV, mask):
        ids = torch.tensor([[r.next_token] for r in batch], device=self.device)
        positions = torch.tensor([[len(r.tokens)] for r in batch], device=self.device)
        mask = torch.cat([mask, torch.ones(len(batch), 1, dtype=torch.long, device=self.device)], 1)
        logits, kv = self._forward(ids, kv, positions, mask)
        self._stats["decode_steps"] += 1
        self._stats["decode_rows"] += len(batch)
        keep = []
        T = mask.shape[1]
        for i, r in enumerate(batch):
            r.tokens.append(r.next_token)
            if self._take(r, logits[i]):
                pad = T - len(r.tokens)
                self._finish(r, kv_cache.row(kv, i, pad))
            else:
                keep.append(i)
        if len(keep) == len(batch):
            return batch, kv, mask
        if not keep:
            return [], [], None
        batch = [batch[i] for i in keep]
        kv, mask = kv_cache.keep_rows(kv, mask, keep, [len(r.tokens) for r in batch])
        return batch, kv, mask

    def clear_cache(self) -> None:
        """Forget every kept KV cache (after a weight update they belong to the old weights)."""
        self.cache.clear()

    def release(self, request_id) -> None:
        """The trajectory ``request_id`` has ended: its kept cache is dropped (no later turn will use it)."""
        self.cache.release(str(request_id))

    def describe(self) -> dict[str, Any]:
        return dict(self.stats, kept=len(self.cache), kept_bytes=self.kept_bytes)
