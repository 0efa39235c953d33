"""Which corpus a run searches, checked against what the retriever serves.

A paper preset expects wiki-18 (``search_r1.expect_corpus: wiki18`` in configs/_base.yaml): trained or
evaluated against the bundled 5,148-passage sample, it would run for days and give numbers that mean
nothing beside the paper's. The retriever's ``GET /health`` says what it serves (``passages``,
``index_id``); a mismatch is refused before Ray starts (:func:`train.trainer.preflight.run_all`) and before
the evaluator asks a question for a paper row (``python -m train.evaluate --paper-row``).

An expectation is a corpus name of :data:`CORPORA`, a passage count, a 16-hex ``index_id`` (one exact
index build), or ``any`` (no check). A retriever that does not answer is not checked here: the launchers
refuse it first (scripts/_common.sh), and the agent loop waits for it.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from train.errors import ConfigError

#: corpora by name: the passages their /health reports
CORPORA = {"wiki18": 21_015_324, "sample": 5_148}
ANY = "any"
#: the key and the flag that set the expectation (named in every refusal)
TRAINING_KEY = "search_r1.expect_corpus"
EVAL_FLAG = "--expect-corpus"
INDEX_ID = re.compile(r"^[0-9a-f]{16}$")


def parse(value: Any, key: str) -> Optional[tuple[str, Any]]:
    """``("passages", n)``, ``("index_id", id)`` or None (no check) for one expectation."""
    if value is None or str(value).strip().lower() in ("", ANY, "none", "null"):
        return None
    text = str(value).strip().replace(",", "").replace("_", "")
    if str(value).strip() in CORPORA:
        return "passages", CORPORA[str(value).strip()]
    if text.isdigit() and int(text) > 0:
        return "passages", int(text)
    if INDEX_ID.match(str(value).strip()):
        return "index_id", str(value).strip()
    raise ConfigError(f"{key}: expected a corpus name ({', '.join(CORPORA)}), a passage count, a 16-hex index_id "
                      f"of the retriever's /health, or {ANY} (no check); got {value!r}")


def base_url(url: str) -> str:
    url = str(url).rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/retrieve")


def health(url: str, timeout: float = 10.0) -> Optional[dict]:
    """The retriever's ``/health`` answer, or None when nothing answers there."""
    import httpx

    try:
        resp = httpx.get(base_url(url) + "/health", timeout=timeout)
        body = resp.json()
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def describe(info: dict) -> str:
    passages = info.get("passages")
    count = f"{passages:,} passages" if isinstance(passages, int) else "an unknown number of passages"
    names = [n for n, c in CORPORA.items() if c == passages]
    return count + (f" (the {names[0]} corpus)" if names else "") + f", index_id {info.get('index_id')}"


def check(value: Any, url: str, what: str, override: str, log=print) -> Optional[dict]:
    """Raise :class:`ConfigError` when the retriever at ``url`` serves another corpus than ``value`` expects;
    the message starts with ``what`` (the setting that expects it) and names ``override``, the setting that
    accepts this retriever deliberately. Returns /health's answer (None: nothing checked)."""
    want = parse(value, what)
    if want is None:
        return None
    info = health(url)
    if info is None:
        log(f"notice: {what}: no retriever answers at {base_url(url)}/health, so its corpus is not "
            f"checked here")
        return None
    field, expected = want
    got = info.get(field)
    if got == expected:
        return info
    named = next((n for n, c in CORPORA.items() if c == expected), None) if field == "passages" else None
    wanted = (f"{named} ({expected:,} passages)" if named else f"{expected:,} passages") if field == "passages" \
        else f"index_id {expected}"
    raise ConfigError(
        f"{what}: the retriever at {base_url(url)} serves {describe(info)}, not {wanted}. Start the "
        f"retriever this run expects (wiki-18: RETRIEVER=e5 WIKI18=data/wiki18 bash retrieval_launch.sh; "
        f"scripts/reproduce_paper.sh starts it), or set {override} to use this one deliberately")


def training_check(config, log=print) -> Optional[dict]:
    """The trainer's check (before Ray): ``search_r1.expect_corpus`` against ``search_r1.retriever_url``.
    A replica per node (``{node_ip}`` in the URL) is checked on this node (``NODE_IP``, else 127.0.0.1)."""
    import os

    from train.search_r1.config import NODE_IP

    search = config.get("search_r1") or {}
    value = search.get("expect_corpus")
    url = str(search.get("retriever_url") or "http://127.0.0.1:8000/retrieve")
    url = url.replace(NODE_IP, os.environ.get("NODE_IP") or "127.0.0.1")
    return check(value, url, f"{TRAINING_KEY}={value}", f"{TRAINING_KEY}=any", log=log)


def evaluation_check(ask, paper_row: Optional[str], expect: Optional[str], log=print) -> Optional[dict]:
    """The evaluator's check: a paper row expects wiki-18 unless ``--expect-corpus`` says otherwise; no row, no
    check unless ``--expect-corpus`` asks for one. Methods that search nothing (direct, cot) are not checked;
    an in-process ``--index`` is checked by its build's manifest when it has one."""
    value = expect if expect is not None else ("wiki18" if paper_row else None)
    if ask.method in ("direct", "cot") or parse(value, EVAL_FLAG) is None:
        return None
    override = f"{EVAL_FLAG} any"
    if ask.index:
        return _index_check(value, ask.index, override, log)
    what = f"{EVAL_FLAG} {value}" if expect is not None else f"--paper-row {paper_row!r} (the paper's corpus: {value})"
    return check(value, ask.retriever_url, what, override, log=log)


def _index_check(value: Any, index: str, override: str, log=print) -> Optional[dict]:
    import json
    from pathlib import Path

    manifest = Path(index) / "manifest.json"
    if not manifest.is_file():
        log(f"notice: {EVAL_FLAG}={value}: --index {index} has no manifest.json, so its corpus is not checked")
        return None
    count = json.loads(manifest.read_text()).get("count")
    field, expected = parse(value, EVAL_FLAG)
    if field != "passages" or count == expected:
        return {"passages": count}
    raise ConfigError(f"{EVAL_FLAG}={value}: --index {index} holds {count:,} passages, not {expected:,}. Use the "
                      f"index this evaluation expects, or pass {override} to use this one deliberately")
