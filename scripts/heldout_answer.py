"""The held-out question that `make smollm2` asks, and the check of infer.py's answer to it.

    python scripts/heldout_answer.py question ID              # the question of a held-out id (data/split.json)
    python scripts/heldout_answer.py check ID TRANSCRIPT      # infer.py's printout: tags and answer; exit 1 if wrong
    python scripts/heldout_answer.py tags ID TRANSCRIPT       # the protocol's tags and an answer, right or wrong

``question`` refuses an id that is not on the test side of data/split.json (no stage trains on those).
``check`` reads what infer.py printed for that question and passes when the model wrote the protocol's
tags (a ``<search>`` and an ``<answer>``) and its answer matches a gold answer (exact match after the
usual normalisation): exit 0; otherwise it says what was wrong and exits 1. ``tags`` (CI's quick twin of
`make smollm2`, a warm start too short to answer reliably) passes on the protocol alone: a search, then
an answer, right or wrong; it says which. Exit 2: bad input.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: infer.py's last line: ``Answer: TEXT   [N searches, stopped: REASON]``
ANSWER_LINE = re.compile(r"^Answer: (.*?)   \[(\d+) searches?, stopped: [^\]]*\]\s*$")


def heldout_record(qid: str, data_dir: Path = ROOT / "data") -> dict:
    """The bundled record (question, golden_answers, dataset) of ``qid``, which must be a held-out id."""
    test = set(json.loads((data_dir / "split.json").read_text())["test"])
    if qid not in test:
        raise ValueError(f"{qid!r} is not a held-out question (the test side of {data_dir / 'split.json'})")
    with open(data_dir / "qa.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["id"] == qid:
                return rec
    raise ValueError(f"{qid!r}: in {data_dir / 'split.json'} but not in {data_dir / 'qa.jsonl'}")


def check(transcript: str, golds: list[str], tags_only: bool = False) -> tuple[bool, str]:
    """(passed, why) for infer.py's printout of one question against its gold answers (``tags_only``: the
    protocol followed and an answer given suffice)."""
    from train.search_r1.reward import em

    lines = [m for m in map(ANSWER_LINE.match, transcript.splitlines()) if m]
    if not lines:
        return False, "no 'Answer: ...' line in the printout (did infer.py fail?)"
    answer, searches = lines[-1].group(1), int(lines[-1].group(2))
    missing = [tag for tag in ("<search>", "<answer>") if tag not in transcript]
    if missing or searches < 1:
        return False, f"the model did not follow the protocol (missing {missing or ['a search']}); answer {answer!r}"
    if answer == "(no answer)":
        return False, "the model searched but gave no answer"
    if not em(answer, golds):
        return tags_only, f"{'the protocol followed; ' if tags_only else ''}wrong: {answer!r}, gold {golds}"
    return True, f"correct: {answer!r} matches the gold {golds}, after {searches} search(es)"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("question", "check", "tags") or len(argv) != (2 if argv[0] == "question" else 3):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        rec = heldout_record(argv[1])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if argv[0] == "question":
        print(rec["question"])
        return 0
    path = Path(argv[2])
    if not path.is_file():
        print(f"error: {path}: no such file", file=sys.stderr)
        return 2
    passed, why = check(path.read_text(errors="replace"), rec["golden_answers"], tags_only=argv[0] == "tags")
    print(why)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
