"""The Search-R1 agent loop for verl 0.9.1, registered as ``search_r1``.

Per trajectory: generate (token ids in, token ids out) until the first ``</search>`` or
``</answer>``; on a search, call the retrieval server and append the observation tokens with
``response_mask`` 0; repeat up to ``max_turns`` searches, then one last generation. The text
protocol comes from :mod:`train.protocol`; nothing here knows the tag strings.

Stopping: the request asks the server for stop strings in its own vocabulary (:func:`stop_params`),
and every returned turn is also cut on our side right after the token that completes the first stop tag (a backend that ignores stop strings still never puts
tokens past the tag into the trajectory).

Configuration: the top-level ``search_r1:`` block of the trainer config (see
``configs/search_r1.yaml``); :class:`SearchConfig` validates it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence
from uuid import uuid4

import numpy as np
import torch

from retrieval.client import RetrievalClient, RetrievalServerError, RetrieverUnavailable, contents_of, wait_healthy_async
from retrieval.server import MAX_QUERY_CHARS
from train import protocol
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopManager, AgentLoopOutput, register
from verl.utils.ray_utils import auto_await

log = logging.getLogger(__name__)

AGENT_NAME = "search_r1"
EVAL_SPLITS = ("test", "val", "validation", "dev")


@dataclass
class SearchConfig:
    retriever_url: str = "http://127.0.0.1:8000/retrieve"
    topk: int = 3
    max_turns: int = 3  # searches in training (then one last generation)
    val_max_turns: int = 4  # for rows whose extra_info.split is test/val/dev
    max_turn_tokens: int = 500  # new tokens per generation
    max_obs_tokens: int = 500  # tokens per observation (whole passages dropped to fit)
    timeout: float = 120.0  # per search, in total (all retries)
    retries: int = 5
    backoff: float = 0.5
    strict: bool = False  # raise when the retriever stays down, instead of a "search failed" observation
    # Abort the step when more than this fraction of its searches failed (retriever down or erroring):
    # otherwise the policy trains on "search failed" rollouts. 1.0 = never abort.
    max_failure_rate: float = 0.5
    # A rollout in which searches failed because the retriever was unreachable or kept answering 5xx
    # (an outage, not a bad query) is redone once the retriever answers /health again, waiting up to
    # outage_wait_s (a line every 30 s); at most outage_redos times per rollout, then the run stops.
    # outage_wait_s 0 = never wait: outage failures then only count toward max_failure_rate.
    outage_wait_s: float = 600.0
    outage_redos: int = 3
    max_query_chars: int = MAX_QUERY_CHARS  # longer queries are cut to this (the server's limit)

    @classmethod
    def from_config(cls, cfg: Any) -> "SearchConfig":
        d = dict(cfg or {})
        retriever = d.pop("retriever", None) or {}
        d.setdefault("retriever_url", retriever.get("url", cls.retriever_url))
        if "topk" in retriever:
            d.setdefault("topk", retriever["topk"])
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown search_r1 config keys: {sorted(unknown)} (known: {sorted(known)})")
        out = cls(**d)
        for name in ("topk", "max_turn_tokens", "max_obs_tokens"):
            if int(getattr(out, name)) < 1:
                raise ValueError(f"search_r1.{name} must be >= 1, got {getattr(out, name)}")
        for name in ("max_turns", "val_max_turns", "retries", "outage_redos"):
            if int(getattr(out, name)) < 0:
                raise ValueError(f"search_r1.{name} must be >= 0, got {getattr(out, name)}")
        if not 0.0 <= float(out.max_failure_rate) <= 1.0:
            raise ValueError(f"search_r1.max_failure_rate must be in [0, 1], got {out.max_failure_rate}")
        if float(out.outage_wait_s) < 0:
            raise ValueError(f"search_r1.outage_wait_s must be >= 0 (0 = do not wait), got {out.outage_wait_s}")
        if int(out.max_query_chars) < 1:
            raise ValueError(f"search_r1.max_query_chars must be >= 1, got {out.max_query_chars}")
        return out


# One pooled client per (url, event loop): agent loops are built per trajectory.
_clients: dict[tuple, RetrievalClient] = {}


def _client_for(cfg: SearchConfig) -> RetrievalClient:
    key = (cfg.retriever_url, cfg.timeout, cfg.retries, id(asyncio.get_running_loop()))
    if key not in _clients:
        _clients[key] = RetrievalClient(cfg.retriever_url, topk=cfg.topk, timeout=cfg.timeout, retries=cfg.retries,
                                        backoff=cfg.backoff)
    return _clients[key]


def stop_params(rollout_name: Optional[str]) -> dict:
    """Stop-string sampling parameters in the rollout engine's own vocabulary, keeping the tag in
    the output: vLLM (and our hf rollout) ``include_stop_str_in_output``, SGLang ``no_stop_trim``."""
    stops = list(protocol.STOP_STRINGS)
    if rollout_name == "sglang":
        return {"stop": stops, "no_stop_trim": True}
    return {"stop": stops, "include_stop_str_in_output": True}


def cut_after_stop(tokenizer, ids: list[int], stops: Optional[Sequence[str]] = None) -> list[int]:
    """The shortest prefix of ``ids`` whose text contains a complete stop tag (all of ``ids`` when
    none does; ``stops`` defaults to the protocol's). Prefix containment is monotone, so bisection
    needs O(log n) decodes."""
    def found(text: str) -> bool:
        return protocol.find_stop(text) is not None if stops is None else any(t in text for t in stops)

    if not ids or not found(tokenizer.decode(ids)):
        return ids
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if not found(tokenizer.decode(ids[:mid])):
            lo = mid + 1
        else:
            hi = mid
    return ids[:lo]


@functools.lru_cache(maxsize=16)
def _generation_eos_ids(model_path: str) -> tuple[int, ...]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the tokenizer's EOS only
        return ()
    if eos is None:
        return ()
    return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))


def end_of_turn_ids(tokenizer, model_path: Optional[str] = None) -> set[int]:
    """Token ids that end a generation: the tokenizer's EOS plus every ``eos_token_id`` of the model's
    generation config (vLLM stops on all of them; Qwen2.5-Instruct: ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids = {tokenizer.eos_token_id} | set(getattr(tokenizer, "additional_eos_ids", []) or [])
    if model_path:
        ids |= set(_generation_eos_ids(str(model_path)))
    return {i for i in ids if i is not None}


def check_failure_rate(searches: int, failed: int, max_rate: float, url: str) -> None:
    """Abort (RuntimeError) when a step's share of failed searches passes ``max_rate``."""
    if searches and failed / searches > max_rate:
        raise RuntimeError(
            f"search_r1: {failed} of {searches} searches in this step failed ({failed / searches:.0%}, more than "
            f"search_r1.max_failure_rate={max_rate:g}); training on 'search failed' observations would teach the "
            f"policy not to search. Is the retriever at {url} up and healthy (python -m retrieval.client "
            f"{url.removesuffix('/retrieve')})? Raise search_r1.max_failure_rate (1.0 = never abort) to go on anyway.")


def answer_token_span(tokenizer, ids: list[int]) -> int:
    """Number of trailing tokens of an answer turn that cover its last ``<answer>...</answer>``."""
    for j in range(len(ids) - 1, -1, -1):
        if protocol.ANSWER_OPEN in tokenizer.decode(ids[j:]):
            return len(ids) - j
    return 0


@register(AGENT_NAME)
class SearchR1AgentLoop(AgentLoopBase):
    """verl agent loop speaking the Search-R1 protocol."""

    def __init__(self, *args, search_client=None, eos_from: Optional[str] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.search = SearchConfig.from_config(self.config.get("search_r1"))
        self.response_length = int(self.rollout_config.response_length)
        self._stop = stop_params(self.rollout_config.get("name"))
        self._client = search_client
        model_cfg = self.config.get("actor_rollout_ref", {}).get("model", {}) or {}
        self._eos = end_of_turn_ids(self.tokenizer, model_cfg.get("path") if eos_from is None else eos_from)

    @property
    def client(self):
        if self._client is None:
            self._client = _client_for(self.search)
        return self._client

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    async def _observe(self, query: str) -> tuple[str, str]:
        """Observation text for a search, and how it went: ``"ok"``, ``"outage"`` (the retriever was
        unreachable, timed out or kept answering 5xx: the rollout is redone once it is back) or
        ``"failed"`` (it rejected the query or answered something malformed). Failures become the
        failure observation; only ``strict`` re-raises an unreachable retriever."""
        query = query[: self.search.max_query_chars]  # what the server accepts
        try:
            result = await self.client.aretrieve([query], topk=self.search.topk)
            docs = contents_of(result[0])
        except (RetrieverUnavailable, RetrievalServerError) as e:
            if self.search.strict:
                raise
            log.warning("search %r failed: %s (search_r1.timeout=%g s over search_r1.retries=%d retries); answered "
                        "with a failure observation", query[:200], e, self.search.timeout, self.search.retries)
            return protocol.format_search_failure(), "outage"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (one bad search must not kill the step)
            log.warning("search %r failed (%s: %s); answered with a failure observation", query[:200],
                        type(e).__name__, e)
            return protocol.format_search_failure(), "failed"
        return protocol.format_observation(docs, max_tokens=self.search.max_obs_tokens,
                                           count_tokens=lambda s: len(self._encode(s))), "ok"

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        request_id = uuid4().hex  # the same for every turn: an engine keeps the KV cache between them
        try:
            return await self._trajectory(request_id, sampling_params, **kwargs)
        finally:  # the trajectory is over: an engine that kept its cache for the next turn can drop it
            release = getattr(self.server_manager, "release", None)
            if callable(release):
                release(request_id)

    async def _trajectory(self, request_id: str, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info") or {}
        is_eval = isinstance(extra_info, dict) and extra_info.get("split") in EVAL_SPLITS
        max_turns = self.search.val_max_turns if is_eval else self.search.max_turns
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        prompt_ids = self._cap_text_prompt_length(prompt_ids)

        eos = self._eos
        response_ids: list[int] = []
        response_mask: list[int] = []
        logprobs: list[float] = []
        have_logprobs = bool(sampling_params.get("logprobs"))
        answer_len = 0
        n_search = n_executed = n_failed = n_outage = n_invalid = n_answer = n_turns = n_eos_dropped = 0
        search_failed = False
        sent: list[str] = []  # the queries sent to the retriever, as sent (search_r1/repeated_query_share)
        stop_reason = "max_turns"
        for turn in range(max_turns + 1):
            budget = self.response_length - len(response_ids)
            if budget <= 0:
                stop_reason = "length"
                break
            params = dict(sampling_params)
            params.update(max_tokens=min(self.search.max_turn_tokens, budget), **self._stop)
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=prompt_ids + response_ids,
                                                     sampling_params=params)
            ids = cut_after_stop(self.tokenizer, list(out.token_ids))[:budget]
            action = protocol.parse_turn(self.tokenizer.decode(ids))
            if action.kind not in ("answer", "search") and ids and ids[-1] in eos and turn < max_turns:
                # As the released loop: an invalid turn that ended in EOS gets the invalid-action
                # message and the trajectory goes on; the EOS is dropped (the policy is trained to
                # continue here, not to end).
                ids = ids[:-1]
                n_eos_dropped += 1
            n_turns += 1
            response_ids += ids
            response_mask += [1] * len(ids)
            if have_logprobs:
                lp = list(out.log_probs or [])[: len(ids)]
                logprobs += lp + [0.0] * (len(ids) - len(lp))
            if action.kind == "answer":
                n_answer += 1
                answer_len = answer_token_span(self.tokenizer, ids)
                stop_reason = "answer"
                break
            if action.kind == "search":
                n_search += 1
            else:
                n_invalid += 1
            if ids and ids[-1] in eos and action.kind != "search":  # the last generation ended in EOS
                stop_reason = "eos"
                break
            if turn == max_turns:
                stop_reason = "max_turns"  # a search in the last generation is counted, not run
                break
            if len(response_ids) >= self.response_length:
                stop_reason = "length"
                break
            if action.kind == "search":
                sent.append(action.content[: self.search.max_query_chars])
                obs, status = await self._observe(action.content)
                search_failed |= status != "ok"
                n_failed += int(status != "ok")
                n_outage += int(status == "outage")
                n_executed += int(status == "ok")
            else:
                obs = protocol.INVALID_ACTION_MESSAGE
            obs_ids = self._encode(obs)
            room = self.response_length - len(response_ids)
            response_ids += obs_ids[:room]
            response_mask += [0] * min(len(obs_ids), room)
            if have_logprobs:
                logprobs += [0.0] * min(len(obs_ids), room)
            if len(obs_ids) >= room:
                stop_reason = "length"
                break

        answer_mask = [0] * len(response_ids)
        if answer_len:
            answer_mask[len(response_ids) - answer_len:] = [1] * answer_len
        extra = {
            "answer_mask": answer_mask,
            "num_searches": n_search,  # <search> actions, an unexecuted one in the last generation too
            "num_valid_searches": n_executed,  # searches run and answered by the retriever
            "num_eos_dropped": n_eos_dropped,  # invalid turns that ended in EOS and went on
            "num_failed_searches": n_failed,  # searches sent that got the failure observation
            "num_outage_searches": n_outage,  # ... of which the retriever was unreachable or erroring
            "num_valid_actions": n_search + n_answer,
            "num_invalid_actions": n_invalid,
            "num_gen_turns": n_turns,
            "stop_reason": stop_reason,
            "search_failed": search_failed,
            "search_queries": sent,
        }
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=response_mask,
            response_logprobs=logprobs if have_logprobs else None,
            num_turns=2 * n_turns,
            metrics={},
            extra_fields=extra,
        )


#: What V (the adaptive LLDS-MA weight's "valid searches") counts per trajectory: ``parsed`` = every
#: ``<search>`` action, an unexecuted one in the last generation included (the released code);
#: ``executed`` = searches that ran and the retriever answered.
VALID_SEARCH_FIELDS = {"parsed": "num_searches", "executed": "num_valid_searches"}


def add_search_tensors(output, valid_search_count: str = "parsed") -> Any:
    """Pad the per-trajectory ``answer_mask`` lists into an ``[B, R]`` tensor (like ``responses``)
    and add ``batch_valid_searches`` ``[B]`` (the batch mean V, for the adaptive LLDS-MA weight)."""
    nt = output.non_tensor_batch
    if "answer_mask" not in nt:
        return output
    B, R = output.batch["responses"].shape
    mask = torch.zeros(B, R, dtype=torch.int64)
    for i, m in enumerate(nt.pop("answer_mask")):
        m = list(m or [])[:R]
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.int64)
    output.batch["answer_mask"] = mask * output.batch["response_mask"].to(torch.int64)
    field = VALID_SEARCH_FIELDS[valid_search_count]
    valid = np.asarray([float(v or 0) for v in nt.get(field, [0] * B)], dtype=np.float32)
    output.batch["batch_valid_searches"] = torch.full((B,), float(valid.mean()) if B else 0.0)
    return output


def _total(output, *keys: str) -> int:
    """The sum of per-trajectory counts (extra fields) over a rollout batch."""
    nt = output.non_tensor_batch
    return sum(int(v or 0) for key in keys for v in nt.get(key, []))


class SearchR1AgentLoopManager(AgentLoopManager):
    """verl's manager plus the outage rule and :func:`add_search_tensors`. Select it with
    ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=train.agent_loop.SearchR1AgentLoopManager``.

    A rollout whose searches hit a retriever outage (unreachable, timed out, 5xx) is never trained
    on: the manager waits for ``/health`` (``search_r1.outage_wait_s``) and redoes the whole rollout
    (every group resampled; at most ``search_r1.outage_redos`` times), and stops the run when the
    retriever does not come back. Other failures (a rejected query) go to ``max_failure_rate``."""

    @auto_await
    async def generate_sequences(self, prompts):
        search = SearchConfig.from_config(self.config.get("search_r1"))
        for attempt in range(int(search.outage_redos) + 1):
            out = super().generate_sequences(prompts)
            if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
                out = await out
            outage = _total(out, "num_outage_searches")
            if not outage or search.outage_wait_s <= 0:
                break
            sent = _total(out, "num_failed_searches", "num_valid_searches")
            if attempt == int(search.outage_redos):
                raise RuntimeError(
                    f"search_r1: the retriever at {search.retriever_url} failed {outage} of {sent} searches again, in "
                    f"{attempt + 1} rollouts of this step (search_r1.outage_redos={search.outage_redos}); stopping "
                    f"rather than training on 'search failed' observations. Check its log, then resume")
            print(f"search_r1: {outage} of {sent} searches in this rollout failed with the retriever at "
                  f"{search.retriever_url} unreachable or erroring; waiting for it (search_r1.outage_wait_s="
                  f"{search.outage_wait_s:g}), then redoing the rollout ({attempt + 1} of search_r1.outage_redos="
                  f"{search.outage_redos})", flush=True)
            if not await wait_healthy_async(search.retriever_url, search.outage_wait_s, report_every=30.0,
                                            log=lambda m: print(f"search_r1: {m}", flush=True)):
                raise RuntimeError(
                    f"search_r1: the retriever at {search.retriever_url} did not answer /health within "
                    f"search_r1.outage_wait_s={search.outage_wait_s:g} s; stopping rather than training on "
                    f"'search failed' observations. Restart it and resume (trainer.resume_mode=auto) from the "
                    f"last checkpoint; raise search_r1.outage_wait_s to wait longer")
            print("search_r1: the retriever answers again; redoing the rollout", flush=True)
        failed = _total(out, "num_failed_searches")
        check_failure_rate(failed + _total(out, "num_valid_searches"), failed, search.max_failure_rate,
                           search.retriever_url)
        llds = self.config.get("llds") or {}
        return add_search_tensors(out, llds.get("valid_search_count", "parsed"))


def standalone_loop(tokenizer, server_manager, *, search: Optional[dict] = None, response_length: int = 4096,
                    prompt_length: int = 4096, search_client=None, hf_model_type: Optional[str] = None,
                    model_path: Optional[str] = None) -> SearchR1AgentLoop:
    """The same agent loop outside a verl worker (``infer.py``, the evaluator, tests).
    Call from inside a running event loop (verl's base class captures it)."""
    from omegaconf import OmegaConf

    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"response_length": response_length, "prompt_length": prompt_length}},
        "data": {},
        "search_r1": dict(search or {}),
    })
    return SearchR1AgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server_manager, tokenizer=tokenizer,
                             processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                             search_client=search_client, hf_model_type=hf_model_type, eos_from=model_path or "")


def segments(tokenizer, output: AgentLoopOutput) -> list[tuple[str, str]]:
    """The response as (kind, text) runs: "model" (mask 1) and "observation" (mask 0)."""
    out, start = [], 0
    ids, mask = output.response_ids, output.response_mask
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append(("model" if mask[start] else "observation", tokenizer.decode(ids[start:i])))
            start = i
    return out
