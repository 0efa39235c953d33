"""The Search-R1 text protocol: the one module that knows the tags.

Everything that writes or reads Search-R1 text goes through here: the tags, the stop tags, turn parsing
(search / answer / invalid), the observation block, the invalid-action message, observation truncation by
whole passages, answer extraction and the format rule, and the outcomes a turn, a search and a trajectory
report (:class:`Kind`, :class:`SearchStatus`, :class:`StopReason`). The prompts, which quote these tags, are
:mod:`train.search_r1.prompts`. The agent loop, ``infer.py``, the evaluator, the data preparation and the
reward all import from these two modules, so the byte-level format lives in exactly one place.

The strings are byte-compatible with Search-R1 (PeterGriffinJin/Search-R1, ``make_prefix``,
``execute_predictions`` and ``_passages2string``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable, Optional, Sequence

#: the agent loop's registry name (verl's ``@register``): dataset rows name it in ``agent_name``
AGENT_NAME = "search_r1"

# --------------------------------------------------------------------------------------------
# Tags
# --------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------
# Outcomes: of a turn, of a search, of a trajectory (the agent loop's extra fields and metrics)
# --------------------------------------------------------------------------------------------


class Kind(StrEnum):
    """What one generated turn asked for (:attr:`Action.kind`)."""

    SEARCH = "search"
    ANSWER = "answer"
    INVALID = "invalid"


class SearchStatus(StrEnum):
    """How one search went: the retriever answered (``ok``), was unreachable, timed out or kept answering
    5xx (``outage``: the rollout is redone once it is back), or rejected the query or answered something
    malformed (``failed``)."""

    OK = "ok"
    OUTAGE = "outage"
    FAILED = "failed"


class StopReason(StrEnum):
    """Why a trajectory ended (its ``stop_reason``): an answer, an end-of-turn token, the turn cap, a full
    response; ``search_failed``: a baseline's one retrieval failed before it generated anything."""

    ANSWER = "answer"
    EOS = "eos"
    MAX_TURNS = "max_turns"
    LENGTH = "length"
    SEARCH_FAILED = "search_failed"


# --------------------------------------------------------------------------------------------
# Turn parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """What one generated turn asked for."""

    kind: Kind
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
        return Action(Kind.INVALID)
    end, tag = hit
    body = text[: end - len(tag)]
    opener = SEARCH_OPEN if tag == SEARCH_CLOSE else ANSWER_OPEN
    start = body.rfind(opener)
    if start < 0:
        return Action(Kind.INVALID)
    content = body[start + len(opener):].strip()
    if tag == SEARCH_CLOSE:
        return Action(Kind.SEARCH, content) if content else Action(Kind.INVALID)
    return Action(Kind.ANSWER, content)


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
