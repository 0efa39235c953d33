"""The Search-R1 agent loop for verl 0.9.1, registered as ``search_r1``.

Per trajectory: generate (token ids in, token ids out) until the first ``</search>`` or
``</answer>``; on a search, call the retrieval server and append the observation tokens with
``response_mask`` 0; repeat up to ``max_turns`` searches, then one last generation. The text
protocol comes from :mod:`train.search_r1.protocol`; nothing here knows the tag strings.

Stopping: the request asks the server for stop strings in its own vocabulary (:func:`stop_params`),
and every returned turn is also cut on our side right after the token that completes the first stop tag (a backend
that ignores stop strings still never puts tokens past the tag into the trajectory).

Configuration: the top-level ``search_r1:`` block of the trainer config (see
the presets in ``configs/``); :class:`~train.search_r1.config.SearchConfig` validates it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from retrieval.client import RetrievalClient, RetrievalServerError, RetrieverUnavailable, contents_of
from train.search_r1 import protocol
from train.search_r1.config import SearchConfig, resolve_url
from train.search_r1.protocol import Kind, SearchStatus, StopReason

log = logging.getLogger(__name__)

AGENT_NAME = protocol.AGENT_NAME
EVAL_SPLITS = ("test", "val", "validation", "dev")


# One pooled client per (url, event loop): agent loops are built per trajectory.
_clients: dict[tuple, RetrievalClient] = {}


def _client_for(cfg: SearchConfig) -> RetrievalClient:
    key = (cfg.retriever_url, cfg.timeout, cfg.retries, id(asyncio.get_running_loop()))
    if key not in _clients:  # {node_ip}: this node's replica
        _clients[key] = RetrievalClient(resolve_url(cfg.retriever_url), topk=cfg.topk, timeout=cfg.timeout,
                                        retries=cfg.retries, backoff=cfg.backoff)
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


def answer_token_span(tokenizer, ids: list[int]) -> int:
    """Number of trailing tokens of an answer turn that cover its last ``<answer>...</answer>``."""
    for j in range(len(ids) - 1, -1, -1):
        if protocol.ANSWER_OPEN in tokenizer.decode(ids[j:]):
            return len(ids) - j
    return 0


@register(AGENT_NAME)
class SearchR1AgentLoop(AgentLoopBase):
    """verl agent loop speaking the Search-R1 protocol."""

    def __init__(self, *args, search: Optional[SearchConfig] = None, search_client=None, eos_from: Optional[str] = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        # verl builds a loop per trajectory from the trainer config; outside verl the caller hands its settings whole
        self.search = search if search is not None else SearchConfig.of(self.config)
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

    async def _observe(self, query: str) -> tuple[str, SearchStatus]:
        """Observation text for a search (``query`` already cut to what the server accepts), and how it went
        (:class:`~train.search_r1.protocol.SearchStatus`). Failures become the failure observation; only
        ``strict`` re-raises an unreachable retriever."""
        try:
            result = await self.client.aretrieve([query], topk=self.search.topk)
            docs = contents_of(result[0])
        except (RetrieverUnavailable, RetrievalServerError) as e:
            if self.search.strict:
                raise
            log.warning("search %r failed: %s (search_r1.timeout=%g s over search_r1.retries=%d retries); answered "
                        "with a failure observation", query[:200], e, self.search.timeout, self.search.retries)
            return protocol.format_search_failure(), SearchStatus.OUTAGE
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (one bad search must not kill the step)
            log.warning("search %r failed (%s: %s); answered with a failure observation", query[:200],
                        type(e).__name__, e)
            return protocol.format_search_failure(), SearchStatus.FAILED
        return protocol.format_observation(docs, max_tokens=self.search.max_obs_tokens,
                                           count_tokens=lambda s: len(self._encode(s))), SearchStatus.OK

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        request_id = uuid4().hex  # the same for every turn: an engine keeps the KV cache between them
        try:
            return await self._trajectory(request_id, sampling_params, **kwargs)
        finally:  # the trajectory is over: an engine that kept its cache for the next turn can drop it
            release = getattr(self.server_manager, "release", None)
            if callable(release):
                release(request_id)

    async def _trajectory(self, request_id: str, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """The state machine: generate a turn; an answer, an end-of-sequence, the last turn or a full
        response ends it; a search appends its observation, an invalid turn the invalid-action message."""
        extra_info = kwargs.get("extra_info") or {}
        is_eval = isinstance(extra_info, dict) and extra_info.get("split") in EVAL_SPLITS
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        traj = Trajectory(prompt_ids=self._cap_text_prompt_length(prompt_ids),
                          max_turns=self.search.val_max_turns if is_eval else self.search.max_turns,
                          response_length=self.response_length, have_logprobs=bool(sampling_params.get("logprobs")))
        for turn in range(traj.max_turns + 1):
            if traj.room <= 0:
                traj.stop_reason = StopReason.LENGTH
                break
            action, ended_in_eos = await self._generate_turn(traj, request_id, sampling_params, turn)
            if action.kind == Kind.ANSWER:
                traj.stop_reason = StopReason.ANSWER
                break
            if ended_in_eos and action.kind != Kind.SEARCH:  # the last generation ended in EOS
                traj.stop_reason = StopReason.EOS
                break
            if turn == traj.max_turns:
                traj.stop_reason = StopReason.MAX_TURNS  # a search in the last generation is counted, not run
                break
            if traj.room <= 0:
                traj.stop_reason = StopReason.LENGTH
                break
            if not await self._observation_turn(traj, action):
                traj.stop_reason = StopReason.LENGTH
                break
        return traj.output()

    async def _generate_turn(self, traj: "Trajectory", request_id: str, sampling_params: dict[str, Any],
                             turn: int) -> tuple[protocol.Action, bool]:
        """One generation appended to ``traj`` (mask 1), cut after its first stop tag; returns the
        parsed action and whether it ended in an end-of-turn token."""
        params = dict(sampling_params)
        params.update(max_tokens=min(self.search.max_turn_tokens, traj.room), **self._stop)
        out = await self.server_manager.generate(request_id=request_id,
                                                 prompt_ids=traj.prompt_ids + traj.response_ids,
                                                 sampling_params=params)
        ids = cut_after_stop(self.tokenizer, list(out.token_ids))[: traj.room]
        action = protocol.parse_turn(self.tokenizer.decode(ids))
        ended_in_eos = bool(ids) and ids[-1] in self._eos
        if action.kind == Kind.INVALID and ended_in_eos and turn < traj.max_turns:
            # As the released loop: an invalid turn that ended in EOS gets the invalid-action message
            # and the trajectory goes on; the EOS is dropped (the policy is trained to continue here).
            ids = ids[:-1]
            traj.eos_dropped += 1
            ended_in_eos = ids[-1] in self._eos if ids else False
        traj.add_model(ids, out.log_probs)
        if action.kind == Kind.ANSWER:
            traj.answers += 1
            traj.answer_len = answer_token_span(self.tokenizer, ids)
        elif action.kind == Kind.SEARCH:
            traj.searches += 1
        else:
            traj.invalid += 1
        return action, ended_in_eos

    async def _observation_turn(self, traj: "Trajectory", action: protocol.Action) -> bool:
        """The search's observation (or the invalid-action message) appended to ``traj`` (mask 0);
        False when it filled the response."""
        if action.kind == Kind.SEARCH:
            query = action.content[: self.search.max_query_chars]  # longer queries: what the server accepts
            traj.queries.append(query)
            obs, status = await self._observe(query)
            traj.failed += int(status != SearchStatus.OK)
            traj.outage += int(status == SearchStatus.OUTAGE)
            traj.executed += int(status == SearchStatus.OK)
        else:
            obs = protocol.INVALID_ACTION_MESSAGE
        return traj.add_observation(self._encode(obs))


@dataclass
class Trajectory:
    """One trajectory's state while :class:`SearchR1AgentLoop` runs it (as verl's tool agent loop keeps
    an ``AgentData``): the token lists and the counters its extra fields report.

    ``response_ids``/``response_mask``/``logprobs`` grow together (``logprobs`` only when asked):
    model tokens have mask 1, observation tokens mask 0 and log-prob 0."""

    prompt_ids: list[int]
    max_turns: int
    response_length: int
    have_logprobs: bool = False
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    answer_len: int = 0  # trailing model tokens covering the last <answer>...</answer>
    turns: int = 0  # generations
    searches: int = 0  # <search> actions, an unexecuted one in the last generation too
    executed: int = 0  # searches run and answered by the retriever
    failed: int = 0  # searches sent that got the failure observation
    outage: int = 0  # ... of which the retriever was unreachable or erroring
    invalid: int = 0  # turns with neither a search nor an answer
    answers: int = 0
    eos_dropped: int = 0  # invalid turns that ended in EOS and went on
    queries: list[str] = field(default_factory=list)  # as sent (search_r1/repeated_query_share)
    stop_reason: StopReason = StopReason.MAX_TURNS

    @property
    def room(self) -> int:
        """Response tokens left."""
        return self.response_length - len(self.response_ids)

    def add_model(self, ids: list[int], log_probs: Optional[Sequence[float]]) -> None:
        self.turns += 1
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        if self.have_logprobs:
            lp = list(log_probs or [])[: len(ids)]
            self.logprobs += lp + [0.0] * (len(ids) - len(lp))

    def add_observation(self, ids: list[int]) -> bool:
        """Append observation tokens (cut to the room left); False when they filled the response."""
        room = self.room
        self.response_ids += ids[:room]
        self.response_mask += [0] * min(len(ids), room)
        if self.have_logprobs:
            self.logprobs += [0.0] * min(len(ids), room)
        return len(ids) < room

    def output(self) -> AgentLoopOutput:
        answer_mask = [0] * len(self.response_ids)
        if self.answer_len:
            answer_mask[len(self.response_ids) - self.answer_len:] = [1] * self.answer_len
        extra = {
            "answer_mask": answer_mask,
            "num_searches": self.searches,
            "num_valid_searches": self.executed,
            "num_eos_dropped": self.eos_dropped,
            "num_failed_searches": self.failed,
            "num_outage_searches": self.outage,
            "num_valid_actions": self.searches + self.answers,
            "num_invalid_actions": self.invalid,
            "num_gen_turns": self.turns,
            "stop_reason": self.stop_reason,
            "search_failed": self.failed > 0,
            "search_queries": self.queries,
        }
        return AgentLoopOutput(prompt_ids=self.prompt_ids, response_ids=self.response_ids,
                               response_mask=self.response_mask,
                               response_logprobs=self.logprobs if self.have_logprobs else None,
                               num_turns=2 * self.turns, metrics={}, extra_fields=extra)


def standalone_loop(tokenizer, server_manager, *, search: SearchConfig | dict | None = None,
                    response_length: int = 4096, prompt_length: int = 4096, search_client=None,
                    hf_model_type: Optional[str] = None, model_path: Optional[str] = None) -> SearchR1AgentLoop:
    """The same agent loop outside a verl worker (``infer.py``, the evaluator, tests), with ``search`` whole
    (a :class:`SearchConfig`, or a ``search_r1:`` block to parse). Call from inside a running event loop
    (verl's base class captures it)."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"response_length": response_length, "prompt_length": prompt_length}},
        "data": {},
    })
    search = search if isinstance(search, SearchConfig) else SearchConfig.from_config(search)
    return SearchR1AgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server_manager, tokenizer=tokenizer,
                             processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                             search=search, search_client=search_client, hf_model_type=hf_model_type,
                             eos_from=model_path or "")


def segments(tokenizer, output: AgentLoopOutput) -> list[tuple[str, str]]:
    """The response as (kind, text) runs: "model" (mask 1) and "observation" (mask 0)."""
    out, start = [], 0
    ids, mask = output.response_ids, output.response_mask
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            out.append(("model" if mask[start] else "observation", tokenizer.decode(ids[start:i])))
            start = i
    return out
