"""Multi-turn Search-R1 inference outside training, shared by ``infer.py`` and the evaluator: the
:class:`Asker` (one question -> :class:`Result`), the flags both commands take and the factory that
builds an asker from them (:func:`add_asker_flags`, :func:`build_asker`).

It runs the very agent loop used in training (:class:`train.search_r1.agent_loop.SearchR1AgentLoop`) with
a generator backend (:mod:`train.inference.backends`) and a search client.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Optional

from train.errors import InferenceError
from train.search_r1 import protocol
from train.search_r1.config import SearchConfig

#: the defaults outside training: the evaluation settings of the training config (search_r1 block)
MAX_TURNS, TOPK, MAX_NEW_TOKENS = SearchConfig.val_max_turns, SearchConfig.topk, SearchConfig.max_turn_tokens


def add_asker_flags(ap, concurrency_help: str = "questions in flight (default %(default)s)") -> None:
    """The flags ``infer.py`` and ``python -m train.evaluate`` share (read by :func:`build_asker`)."""
    from train.inference.backends import add_engine_flags

    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--retriever-url", default="http://127.0.0.1:8000")
    ap.add_argument("--index", default=None, help="index directory (or .index file) for an in-process retriever")
    ap.add_argument("--corpus", default=None, help="corpus jsonl for --index without a manifest")
    ap.add_argument("--max-turns", type=int, default=MAX_TURNS, help="searches per question (default %(default)s)")
    ap.add_argument("--topk", type=int, default=TOPK, help="passages per search (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="per turn (default %(default)s)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--concurrency", type=int, default=256, help=concurrency_help)
    add_engine_flags(ap)


def check_asker_flags(ap, args) -> None:
    """argparse errors (exit 2, naming the flag) for bad :func:`add_asker_flags` values."""
    from train.inference.backends import check_engine_flags

    if args.concurrency < 1:
        ap.error("--concurrency must be >= 1")
    if args.topk < 1:
        ap.error("--topk must be >= 1")
    if args.max_turns < 0:
        ap.error("--max-turns must be >= 0")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    check_engine_flags(ap, args)


def build_asker(args, generator=None, *, temperature: float = 0.0, seed: int = 0) -> "Asker":
    """The asker for one engine in this process, from :func:`add_asker_flags` arguments (``generator``
    replaces the model backend in tests). ``args.method`` (the evaluator's) defaults to the agent."""
    from train.inference.backends import engine_settings, load_tokenizer_and_check, make_generator, make_search_client

    method = getattr(args, "method", "search_r1")
    tokenizer = getattr(generator, "tokenizer", None) or load_tokenizer_and_check(args.model)
    client = None
    if method in ("search_r1", "rag"):  # direct and cot need no retriever
        client = make_search_client(args.retriever_url, args.corpus, args.index, topk=args.topk)
    gen = generator or make_generator(args.model, args.backend, args.device, seed,
                                      tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
                                      vllm=engine_settings(args))
    return Asker(gen, tokenizer, client, max_turns=args.max_turns, topk=args.topk, temperature=temperature,
                 max_new_tokens=args.max_new_tokens, concurrency=args.concurrency, model_path=args.model,
                 method=method)


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
    """Ask questions with one generator and one search client (async; many at once).

    ``method``: ``search_r1`` runs the agent loop (search as often as the model asks, up to
    ``max_turns``); ``direct``, ``cot`` and ``rag`` are the baselines of Search-R1's table, one
    generation with their prompt (:mod:`train.search_r1.protocol`), ``rag`` with the top-``topk`` passages for
    the question in it."""

    def __init__(self, generator, tokenizer, search_client, *, max_turns: int = MAX_TURNS, topk: int = TOPK,
                 temperature: float = 0.0, max_new_tokens: int = MAX_NEW_TOKENS,
                 max_obs_tokens: int = SearchConfig.max_obs_tokens,
                 response_length: int = 8192, concurrency: int = 256, model_path: Optional[str] = None,
                 method: str = "search_r1"):
        if method not in protocol.METHODS:
            raise InferenceError(f"--method must be one of {', '.join(protocol.METHODS)}, got {method!r}")
        self.method = method
        if max_turns < 0:
            raise InferenceError("--max-turns must be >= 0")
        if max_new_tokens < 1:
            raise InferenceError("--max-new-tokens must be >= 1")
        if temperature < 0:
            raise InferenceError("--temperature must be >= 0")
        self.generator, self.tokenizer, self.client = generator, tokenizer, search_client
        self.search = {"max_turns": max_turns, "val_max_turns": max_turns, "topk": topk,
                       "max_turn_tokens": max_new_tokens, "max_obs_tokens": max_obs_tokens}
        self.temperature, self.response_length = temperature, response_length
        if concurrency < 1:
            raise InferenceError("--concurrency must be >= 1")
        self.model_path = model_path  # its generation config names the end-of-turn tokens
        self.concurrency = concurrency
        self._sem = asyncio.Semaphore(concurrency)

    async def ask(self, question: str) -> Result:
        if self.method != "search_r1":
            return await self._ask_once(question)
        from train.search_r1.agent_loop import segments, standalone_loop

        messages = protocol.make_messages(question)  # raises on an empty question
        model_type = getattr(getattr(getattr(self.generator, "model", None), "config", None), "model_type", None)
        params = {"temperature": self.temperature, "top_p": 1.0}
        async with self._sem:  # the loop (and its state) exists only while the question is in flight
            loop = standalone_loop(self.tokenizer, self.generator, search=self.search, search_client=self.client,
                                   response_length=self.response_length, hf_model_type=model_type,
                                   model_path=self.model_path)
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

        protocol.normalize_question(question)  # raises on an empty question
        contents, failed = None, 0
        if self.method == "rag":
            try:
                contents = contents_of((await self.client.aretrieve([question], topk=self.search["topk"]))[0])
            except Exception as e:  # noqa: BLE001  (counted and reported as a failed search)
                import logging

                logging.getLogger(__name__).warning("retrieval for %r failed: %s", question[:200], e)
                failed = 1
        if failed:
            return Result(question=question, answer=None, segments=[], searches=0, stop_reason="search_failed",
                          response=protocol.format_search_failure(), failed_searches=1)
        messages = protocol.make_method_messages(self.method, question, contents)
        if getattr(self.tokenizer, "chat_template", None):
            prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
                prompt_ids = prompt_ids["input_ids"]
        else:
            prompt_ids = self.tokenizer.encode(messages[0]["content"], add_special_tokens=False)
        params = {"temperature": self.temperature, "top_p": 1.0, "max_tokens": self.search["max_turn_tokens"],
                  "stop": [protocol.ANSWER_CLOSE], "include_stop_str_in_output": True}
        async with self._sem:
            out = await self.generator.generate(request_id=None, prompt_ids=list(prompt_ids), sampling_params=params)
        ids = cut_after_stop(self.tokenizer, list(out.token_ids), [protocol.ANSWER_CLOSE])
        eos = end_of_turn_ids(self.tokenizer, self.model_path or "")
        response = self.tokenizer.decode(ids)
        answer = protocol.extract_answer(response)
        stop = "answer" if answer is not None else ("eos" if ids and ids[-1] in eos else "length")
        return Result(question=question, answer=answer, segments=[("model", response)], searches=0,
                      stop_reason=stop, response=response, valid_searches=int(contents is not None),
                      generated_tokens=len(ids))
