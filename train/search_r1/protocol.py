"""The Search-R1 text protocol: the one module that knows the tags.

Everything that writes or reads Search-R1 text goes through here: the prompt template, the
stop tags, turn parsing (search / answer / invalid), the observation block, the invalid-action
message, observation truncation by whole passages, and answer extraction. The agent loop,
``infer.py``, the evaluator, the data preparation and the reward all import from this module,
so the byte-level format lives in exactly one place.

The strings are byte-compatible with Search-R1 (PeterGriffinJin/Search-R1, ``make_prefix``,
``execute_predictions`` and ``_passages2string``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

#: the agent loop's registry name (verl's ``@register``): dataset rows name it in ``agent_name``
AGENT_NAME = "search_r1"

# --------------------------------------------------------------------------------------------
# Prompt
# --------------------------------------------------------------------------------------------

PROMPT_TEMPLATE = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without "
    "detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"

#: Generation of one turn stops at the first of these (the tag is kept in the output).
STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. "
    "If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

#: Observation returned when the retriever could not be reached (training goes on).
SEARCH_FAILED_TEXT = "Search failed: the retrieval service did not answer."


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
    "Provide the final answer inside <answer> and </answer> directly, without reasoning or detailed "
    "illustrations, for example <answer> Beijing </answer>. Question: {question}\n"
)

#: Chain of thought, then answer: Search-R1's ``scripts/data_process/nq.py`` (``make_prefix``,
#: template ``base``), the prompt of its no-search rows.
COT_TEMPLATE = (
    "Answer the given question. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. Question: {question}\n"
)

#: RAG: the top-k passages for the question in the prompt, then answer: Search-R1's
#: ``scripts/data_process/nq_rag.py`` (``make_prefix``, template ``base``; the context is its
#: ``format_reference``: one ``Doc i(Title: ...) text`` line per passage).
RAG_TEMPLATE = (
    "Answer the given question with some potentially useful context. "
    "You should analyze the question carefully, evaluate the given context (which may or may not be useful), "
    "and then generate an accurate and well-reasoned response. "
    "You should first have a reasoning process in mind and then provides the answer. "
    "Show your reasoning in <think> </think> tags and return the final answer in <answer> </answer> tags, "
    "for example <answer> Beijing </answer>. Question: {question} Context: {context} \n"
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


# --------------------------------------------------------------------------------------------
# Turn parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """What one generated turn asked for."""

    kind: str  # "search" | "answer" | "invalid"
    content: str = ""


def find_stop(text: str) -> Optional[tuple[int, str]]:
    """Position just past the first stop tag in ``text`` and that tag, or None."""
    best: Optional[tuple[int, str]] = None
    for tag in STOP_STRINGS:
        i = text.find(tag)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, tag)
    return None if best is None else (best[0] + len(best[1]), best[1])


def truncate_at_stop(text: str) -> str:
    """``text`` cut right after its first stop tag (unchanged when it has none)."""
    hit = find_stop(text)
    return text if hit is None else text[: hit[0]]


def parse_turn(text: str) -> Action:
    """Decide the action of one generated turn.

    The turn is read up to its first stop tag. ``...<search> q </search>`` is a search for the
    stripped text between the *last* ``<search>`` and the ``</search>``; ``...<answer> a
    </answer>`` is an answer; anything else (no stop tag, a closing tag without its opening
    tag, an empty query) is invalid.
    """
    hit = find_stop(text)
    if hit is None:
        return Action("invalid")
    end, tag = hit
    body = text[: end - len(tag)]
    opener = SEARCH_OPEN if tag == SEARCH_CLOSE else ANSWER_OPEN
    start = body.rfind(opener)
    if start < 0:
        return Action("invalid")
    content = body[start + len(opener):].strip()
    if tag == SEARCH_CLOSE:
        return Action("search", content) if content else Action("invalid")
    return Action("answer", content)


# --------------------------------------------------------------------------------------------
# Observations
# --------------------------------------------------------------------------------------------


def split_contents(contents: str) -> tuple[str, str]:
    """wiki-18 ``contents`` -> (title line as stored, quotes included; passage text)."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passage(rank: int, contents: str) -> str:
    """``Doc {rank}(Title: {title}) {text}`` for a 1-based rank."""
    title, text = split_contents(contents)
    return f"Doc {rank}(Title: {title}) {text}"


def format_observation(
    contents: Sequence[str],
    *,
    max_tokens: Optional[int] = None,
    count_tokens: Optional[Callable[[str], int]] = None,
) -> str:
    """The observation appended after a search: ``\\n\\n<information>Doc 1(...)...</information>\\n\\n``.

    With ``max_tokens`` (and a ``count_tokens`` function), whole passages are dropped from the
    end until the block fits, so the closing ``</information>`` is never cut off. If not even
    the first passage fits, its text is shortened word by word.
    """
    passages = [format_passage(i + 1, c) for i, c in enumerate(contents)]

    def block(ps: Sequence[str]) -> str:
        body = "".join(p + "\n" for p in ps).strip()
        return f"\n\n{INFO_OPEN}{body}{INFO_CLOSE}\n\n"

    if max_tokens is None:
        return block(passages)
    if count_tokens is None:
        raise ValueError("format_observation: max_tokens needs count_tokens")
    while passages and count_tokens(block(passages)) > max_tokens:
        if len(passages) > 1:
            passages.pop()
            continue
        words = passages[0].split(" ")
        lo, hi = 0, len(words)  # largest prefix that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count_tokens(block([" ".join(words[:mid])])) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        passages = [" ".join(words[:lo])] if lo else []
        break
    return block(passages)


def search_turn(query: str, thought: str) -> str:
    """A policy turn that thinks, then searches (a warm start teaches it)."""
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}{SEARCH_OPEN} {query} {SEARCH_CLOSE}"


def answer_turn(answer: str, thought: str) -> str:
    """A policy turn that thinks, then answers (a warm start teaches it)."""
    return f"{THINK_OPEN} {thought} {THINK_CLOSE}{ANSWER_OPEN} {answer} {ANSWER_CLOSE}"


def format_search_failure() -> str:
    """Observation used when the retriever failed after its retries."""
    return f"\n\n{INFO_OPEN}{SEARCH_FAILED_TEXT}{INFO_CLOSE}\n\n"


# --------------------------------------------------------------------------------------------
# Answer extraction (generated text only)
# --------------------------------------------------------------------------------------------

_INFO_BLOCK_RE = re.compile(re.escape(INFO_OPEN) + r".*?(?:" + re.escape(INFO_CLOSE) + r"|\Z)", re.DOTALL)
# The content may not hold another <answer>: "<answer> a <answer> b </answer>" answers "b", as
# parse_turn reads it (the last opening tag before the closing one).
_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"((?:(?!" + re.escape(ANSWER_OPEN) + r").)*?)"
                        + re.escape(ANSWER_CLOSE), re.DOTALL)
_SEARCH_RE = re.compile(re.escape(SEARCH_OPEN) + r"(.*?)" + re.escape(SEARCH_CLOSE), re.DOTALL)
_SPAN_RE = re.compile("(" + "|".join(f"{re.escape(o)}.*?{re.escape(c)}" for o, c in (
    (THINK_OPEN, THINK_CLOSE), (SEARCH_OPEN, SEARCH_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE), (INFO_OPEN, INFO_CLOSE)))
    + ")", re.DOTALL)


def tagged_spans(text: str) -> list[tuple[Optional[str], str]]:
    """``text`` cut into ``(kind, piece)``: a complete think/search/answer/information block with its kind
    (the tag's name), the text between blocks with ``None``; joined back they are ``text`` (infer.py colours them)."""
    return [(p[1:p.index(">")] if i % 2 else None, p) for i, p in enumerate(_SPAN_RE.split(text)) if p]


def _blank(match: re.Match) -> str:
    return " " * (match.end() - match.start())


def generated_text(response: str) -> str:
    """``response`` with every observation blanked out (same length, so offsets still hold).

    Observations are ``<information>...</information>`` blocks (an unclosed one runs to the end)
    and the invalid-action message, which itself quotes the ``<answer>`` tags.
    """
    masked = _INFO_BLOCK_RE.sub(_blank, response)
    return masked.replace(INVALID_ACTION_MESSAGE, " " * len(INVALID_ACTION_MESSAGE))


def answer_span(response: str) -> Optional[tuple[int, int]]:
    """Character span (tags included) of the last complete ``<answer>...</answer>`` that the
    model generated, ignoring anything inside observations; None when there is none. An answer
    must lie within one generation: a span that encloses an observation (``<answer>`` in one turn,
    ``</answer>`` after the invalid-action message) is not an answer, as the agent loop's per-turn
    parse does not take it for one."""
    masked = generated_text(response)
    last = None
    for m in _ANSWER_RE.finditer(masked):
        if masked[m.start(): m.end()] == response[m.start(): m.end()]:
            last = m
    return None if last is None else (last.start(), last.end())


def extract_answer(response: str) -> Optional[str]:
    """Stripped text of the last generated ``<answer>...</answer>``, or None."""
    span = answer_span(response)
    return None if span is None else response[span[0] + len(ANSWER_OPEN): span[1] - len(ANSWER_CLOSE)].strip()


def count_searches(response: str) -> int:
    """Number of complete ``<search>...</search>`` calls in the generated text."""
    return len(_SEARCH_RE.findall(generated_text(response)))


def information_blocks(response: str) -> list[str]:
    """Contents of every ``<information>`` block (for the retrieval-correct format score)."""
    return re.findall(re.escape(INFO_OPEN) + r"(.*?)" + re.escape(INFO_CLOSE), response, re.DOTALL)


# --------------------------------------------------------------------------------------------
# Answer normalisation (SQuAD / Search-R1)
# --------------------------------------------------------------------------------------------

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the words a/an/the, collapse white space."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES_RE.sub(" ", s)
    return " ".join(s.split())


# --------------------------------------------------------------------------------------------
# Format rule (Search-R1's is_valid_sequence, on the response text alone)
# --------------------------------------------------------------------------------------------

_TAG_RE = re.compile(r"(</?(?:think|search|information|answer)>)")
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_INSIDE = {"in_think", "in_search", "in_information", "in_answer"}


def is_valid_sequence(response: str) -> bool:
    """True when the response follows think -> (search -> information -> think)* -> answer,
    with only white space between tags and nothing after the answer."""
    state = "start"
    for part in _TAG_RE.split(response):
        if _TAG_RE.fullmatch(part):
            state = _TRANSITIONS.get((state, part), "")
            if not state:
                return False
        elif part.strip() and state not in _INSIDE:
            return False
    return state == "end"


def question_from_prompt(prompt) -> str:
    """The question of a dataset row's chat prompt (the text after the template's ``Question:``)."""
    text = list(prompt)[-1]["content"]
    return text.rsplit("Question:", 1)[-1].strip()
