"""The prompts of the Search-R1 text protocol: the agent's, and the three baselines' of Search-R1's table.

The tags inside them are :mod:`train.search_r1.protocol`'s constants (the one module that spells the tags),
so the text stays byte-compatible with Search-R1 (PeterGriffinJin/Search-R1, ``make_prefix``) while the tag
strings live in one place. Question normalisation and the chat messages are here too: every prompt a model
sees, in training, ``infer.py``, the evaluator, the data preparation and the warm start, comes from this module.
"""

from __future__ import annotations

from typing import Optional, Sequence

from train.search_r1.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    format_passage,
)

_EXAMPLE = f"{ANSWER_OPEN} Beijing {ANSWER_CLOSE}"

PROMPT_TEMPLATE = (
    "Answer the given question. "
    f"You must conduct reasoning inside {THINK_OPEN} and {THINK_CLOSE} first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    f"{SEARCH_OPEN} query {SEARCH_CLOSE} and it will return the top searched results between {INFO_OPEN} and "
    f"{INFO_CLOSE}. You can search as many times as your want. If you find no further external "
    f"knowledge needed, you can directly provide the answer inside {ANSWER_OPEN} and {ANSWER_CLOSE}, without "
    f"detailed illustrations. For example, {_EXAMPLE}. Question: {{question}}\n"
)


def normalize_question(question: str) -> str:
    """Strip and append ``?`` when missing, as Search-R1 does."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def make_prompt(question: str) -> str:
    """The user-message text for one question."""
    return PROMPT_TEMPLATE.format(question=normalize_question(question))


def make_messages(question: str) -> list[dict]:
    """Chat messages (a single user turn, no system prompt) as Search-R1 builds them."""
    return [{"role": "user", "content": make_prompt(question)}]


def render_prompt(tokenizer, question: str) -> str:
    """Prompt text as the policy sees it: the chat template when the tokenizer has one."""
    messages = make_messages(question)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return messages[0]["content"]


def question_from_prompt(prompt) -> str:
    """The question of a dataset row's chat prompt (the text after the template's ``Question:``)."""
    text = list(prompt)[-1]["content"]
    return text.rsplit("Question:", 1)[-1].strip()


# --------------------------------------------------------------------------------------------
# Baseline prompts (the inference-only rows of Search-R1's table: no search during generation)
# --------------------------------------------------------------------------------------------

#: ``--method`` of the evaluator: the Search-R1 agent, or one of the three baselines.
METHODS = ("search_r1", "direct", "cot", "rag")

#: Direct answer. Search-R1's repository ships no direct-inference prompt; this is its CoT prompt
#: (below) with the reasoning sentence replaced by "directly, without reasoning", so that the answer
#: still comes inside the tags the reward reads.
DIRECT_TEMPLATE = (
    "Answer the given question. "
    f"Provide the final answer inside {ANSWER_OPEN} and {ANSWER_CLOSE} directly, without reasoning or detailed "
    f"illustrations, for example {_EXAMPLE}. Question: {{question}}\n"
)

_COT = (
    "You should first have a reasoning process in mind and then provides the answer. "
    f"Show your reasoning in {THINK_OPEN} {THINK_CLOSE} tags and return the final answer in {ANSWER_OPEN} "
    f"{ANSWER_CLOSE} tags, for example {_EXAMPLE}."
)

#: Chain of thought, then answer: Search-R1's ``scripts/data_process/nq.py`` (``make_prefix``,
#: template ``base``), the prompt of its no-search rows.
COT_TEMPLATE = "Answer the given question. " + _COT + " Question: {question}\n"

#: RAG: the top-k passages for the question in the prompt, then answer: Search-R1's
#: ``scripts/data_process/nq_rag.py`` (``make_prefix``, template ``base``; the context is its
#: ``format_reference``: one ``Doc i(Title: ...) text`` line per passage).
RAG_TEMPLATE = (
    "Answer the given question with some potentially useful context. "
    "You should analyze the question carefully, evaluate the given context (which may or may not be useful), "
    "and then generate an accurate and well-reasoned response. " + _COT + " Question: {question} Context: {context} \n"
)


def format_context(contents: Sequence[str]) -> str:
    """The RAG prompt's context: ``Doc i(Title: ...) text`` and a newline per passage."""
    return "".join(format_passage(i + 1, c) + "\n" for i, c in enumerate(contents))


def make_method_messages(method: str, question: str, contents: Optional[Sequence[str]] = None) -> list[dict]:
    """Chat messages for ``method`` (one of :data:`METHODS`); ``rag`` needs the retrieved ``contents``."""
    q = normalize_question(question)
    if method == "search_r1":
        return make_messages(q)
    templates = {"direct": DIRECT_TEMPLATE, "cot": COT_TEMPLATE, "rag": RAG_TEMPLATE}
    if method not in templates:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method == "rag" and contents is None:
        raise ValueError("the rag prompt needs the retrieved passages")
    context = format_context(contents) if method == "rag" else ""
    return [{"role": "user", "content": templates[method].format(question=q, context=context)}]
