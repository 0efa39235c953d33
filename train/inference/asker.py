"""Multi-turn Search-R1 inference outside training, shared by ``infer.py`` and the evaluator: the
:class:`Asker` (one question -> :class:`Result`) and the factory that builds one from the settings
both commands take (:func:`build_asker`, :class:`train.inference.settings.AskSettings`).

It runs the very agent loop used in training (:class:`train.search_r1.agent_loop.SearchR1AgentLoop`) with
a generator backend (:mod:`train.inference.backends`) and a search client.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Optional

from train.inference.settings import AskSettings
from train.search_r1 import prompts, protocol
from train.search_r1.config import SearchConfig
from train.search_r1.protocol import StopReason


def build_asker(settings: AskSettings, generator=None) -> "Asker":
    """The asker for one engine in this process (``generator`` replaces the model backend in tests).
    The tokenizer is loaded once: the hf engine's own, or (vLLM) before the engine is built, so that a
    bad model fails before minutes of engine start-up."""
    from train.inference.backends import check_model_path, load_tokenizer_and_check, make_generator, make_search_client

    tokenizer = getattr(generator, "tokenizer", None)
    if tokenizer is None and (generator is not None or settings.backend != "hf"):
        tokenizer = load_tokenizer_and_check(settings.model)
    elif generator is None:
        check_model_path(settings.model)  # before the retriever: a wrong path is named first
    client = None
    if settings.method in ("search_r1", "rag"):  # direct and cot need no retriever
        client = make_search_client(settings.retriever_url, settings.corpus, settings.index, topk=settings.topk)
    gen = generator or make_generator(settings)
    return Asker(gen, tokenizer or gen.tokenizer, client, settings)


@dataclass
class Result:
    question: str
    answer: Optional[str]
    segments: list  # (kind, text)
    searches: int
    stop_reason: str
    response: str
    failed_searches: int = 0  # searches answered with the failure observation (retriever down or erroring)
    valid_searches: int = 0  # searches the retriever answered
    generated_tokens: int = 0  # tokens the model generated (observations not counted)

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "searches": self.searches,
                "stop_reason": self.stop_reason, "failed_searches": self.failed_searches,
                "generated_tokens": self.generated_tokens, "trajectory": self.response}


class Asker:
    """Ask questions with one generator and one search client (async; many at once), as ``settings`` say
    (checked where they were read: :meth:`AskSettings.problems`; the default: every default, no model).

    ``method``: ``search_r1`` runs the agent loop (search as often as the model asks, up to
    ``max_turns``); ``direct``, ``cot`` and ``rag`` are the baselines of Search-R1's table, one
    generation with their prompt (:mod:`train.search_r1.prompts`), ``rag`` with the top-``topk`` passages for
    the question in it. ``settings.model``'s generation config names the end-of-turn tokens."""

    def __init__(self, generator, tokenizer, search_client, settings: Optional[AskSettings] = None, *,
                 response_length: int = 8192):
        self.settings = settings = settings if settings is not None else AskSettings(model=None)
        self.generator, self.tokenizer, self.client = generator, tokenizer, search_client
        # the agent loop's search settings, built once: the evaluation turn cap in training is val_max_turns
        self.search = SearchConfig(max_turns=settings.max_turns, val_max_turns=settings.max_turns, topk=settings.topk,
                                   max_turn_tokens=settings.max_new_tokens)
        self.response_length = response_length
        self._sem = asyncio.Semaphore(settings.concurrency)

    @property
    def method(self) -> str:
        return self.settings.method

    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    async def ask(self, question: str) -> Result:
        if self.method != "search_r1":
            return await self._ask_once(question)
        from train.search_r1.agent_loop import segments, standalone_loop

        messages = prompts.make_messages(question)  # raises on an empty question
        model_type = getattr(getattr(getattr(self.generator, "model", None), "config", None), "model_type", None)
        params = {"temperature": self.settings.temperature, "top_p": 1.0}
        async with self._sem:  # the loop (and its state) exists only while the question is in flight
            loop = standalone_loop(self.tokenizer, self.generator, search=self.search, search_client=self.client,
                                   response_length=self.response_length, hf_model_type=model_type,
                                   model_path=self.settings.model)
            out = await loop.run(params, raw_prompt=messages)
        response = self.tokenizer.decode(out.response_ids)
        return Result(question=question, answer=protocol.extract_answer(response),
                      segments=segments(self.tokenizer, out), searches=out.extra_fields["num_searches"],
                      stop_reason=out.extra_fields["stop_reason"], response=response,
                      failed_searches=int(out.extra_fields.get("num_failed_searches", 0)),
                      valid_searches=int(out.extra_fields.get("num_valid_searches", 0)),
                      generated_tokens=int(sum(out.response_mask)))

    async def _ask_once(self, question: str) -> Result:
        """A baseline: one generation, stopped after ``</answer>``. ``rag`` retrieves first; a retrieval
        that fails counts as a failed search (the evaluator keeps no such row)."""
        from retrieval.client import contents_of
        from train.search_r1.agent_loop import cut_after_stop, end_of_turn_ids

        prompts.normalize_question(question)  # raises on an empty question
        contents, failed = None, 0
        if self.method == "rag":
            try:
                contents = contents_of((await self.client.aretrieve([question], topk=self.search.topk))[0])
            except Exception as e:  # noqa: BLE001  (counted and reported as a failed search)
                import logging

                logging.getLogger(__name__).warning("retrieval for %r failed: %s", question[:200], e)
                failed = 1
        if failed:
            return Result(question=question, answer=None, segments=[], searches=0, stop_reason=StopReason.SEARCH_FAILED,
                          response=protocol.format_search_failure(), failed_searches=1)
        messages = prompts.make_method_messages(self.method, question, contents)
        if getattr(self.tokenizer, "chat_template", None):
            prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
                prompt_ids = prompt_ids["input_ids"]
        else:
            prompt_ids = self.tokenizer.encode(messages[0]["content"], add_special_tokens=False)
        params = {"temperature": self.settings.temperature, "top_p": 1.0, "max_tokens": self.search.max_turn_tokens,
                  "stop": [protocol.ANSWER_CLOSE], "include_stop_str_in_output": True}
        async with self._sem:
            out = await self.generator.generate(request_id=None, prompt_ids=list(prompt_ids), sampling_params=params)
        ids = cut_after_stop(self.tokenizer, list(out.token_ids), [protocol.ANSWER_CLOSE])
        eos = end_of_turn_ids(self.tokenizer, self.settings.model or "")
        response = self.tokenizer.decode(ids)
        answer = protocol.extract_answer(response)
        stop = StopReason.ANSWER if answer is not None else (StopReason.EOS if ids and ids[-1] in eos else
                                                             StopReason.LENGTH)
        return Result(question=question, answer=answer, segments=[("model", response)], searches=0,
                      stop_reason=stop, response=response, valid_searches=int(contents is not None),
                      generated_tokens=len(ids))
