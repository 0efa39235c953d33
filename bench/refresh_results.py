"""Rewrite the tables of bench/RESULTS.md that come from recorded runs, from the commands that print them.

    python bench/refresh_results.py           # after a study run is recorded: the replay and the SmolLM2 tables
    python bench/refresh_results.py --check   # exit 1, naming the stale block, when RESULTS.md is not what they print

Two blocks, each replaced whole by what its command prints today:

- the collapse warning's replay (:data:`REPLAY`): from the line that opens its first table to the line with
  the levels it ships;
- the SmolLM2 study's tables (``bench/study.py --model smollm2``, which also rewrites bench/study/smollm2.json
  and .png): from the first ``**<regime>** regime`` line of the SmolLM2 section to its ``![curves]`` line.

The prose around them is left alone: a number it quotes is the writer's to update.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
#: the toy's variants kept out of every choice of signal and margin (added to the corpus after those choices)
HOLDOUT = ["grpo_updates4", "grpo_lr2_nokl", "llds_updates4", "lldsma_updates4", "drift_updates4", "llds_updates8",
           "lldsma_updates8", "drift_updates8", "lldsma", "drift"]
#: the replay RESULTS.md shows (its section's command): fitted on the toy, held-out variants, SmolLM2 as the test
REPLAY = ["-m", "train.collapse", "replay", "bench/collapse_corpus/toy", "--holdout", *HOLDOUT,
          "--test", "bench/collapse_corpus/smollm2"]
STUDY = ["bench/study.py", "--model", "smollm2"]
SMOLLM2_SECTION = "## LLDS vs GRPO vs LLDS-MA vs SAPO's drift penalty, over seeds: SmolLM2"
CURVES = "![curves](study/smollm2.png)"


def printed(args: list[str]) -> list[str]:
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"python {' '.join(args)} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout.splitlines()


def replace(lines: list[str], start, end, new: list[str], what: str, first: int = 0) -> list[str]:
    """``lines`` with the block from the first line (at or after ``first``) that ``start`` accepts to the next
    that ``end`` accepts, both included, replaced by ``new``."""
    s = next((i for i in range(first, len(lines)) if start(lines[i])), None)
    e = next((i for i in range(s, len(lines)) if end(lines[i])), None) if s is not None else None
    if e is None:
        raise SystemExit(f"{RESULTS}: the {what} block was not found (its first or last line changed?)")
    return lines[:s] + new + lines[e + 1:]


def refreshed(text: str) -> str:
    lines = text.split("\n")
    replay = printed(REPLAY)
    lines = replace(lines, lambda ln: ln.endswith("warning thresholds fitted on the other seed fold(s)"),
                    lambda ln: ln.startswith("thresholds fitted on every natural run"), replay, "replay")
    study = [ln for ln in printed(STUDY) if not ln.startswith("-> ")]
    while study and not study[-1].strip():
        study.pop()
    section = next((i for i, ln in enumerate(lines) if ln.startswith(SMOLLM2_SECTION)), None)
    if section is None:
        raise SystemExit(f"{RESULTS}: no section starting {SMOLLM2_SECTION!r}")
    lines = replace(lines, lambda ln: ln.startswith("**") and ln.endswith("** regime"), lambda ln: ln == CURVES,
                    [*study, "", CURVES], "SmolLM2 study", first=section)
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    args = ap.parse_args(argv)
    old = RESULTS.read_text()
    new = refreshed(old)
    if args.check:
        if new != old:
            import difflib

            diff = difflib.unified_diff(old.splitlines(), new.splitlines(), "RESULTS.md", "what the commands print",
                                        lineterm="", n=0)
            raise SystemExit("bench/RESULTS.md is stale; run: python bench/refresh_results.py\n" + "\n".join(diff))
        print("bench/RESULTS.md holds what the replay and the study print")
        return
    RESULTS.write_text(new)
    print("bench/RESULTS.md: " + ("rewritten" if new != old else "already current"))


if __name__ == "__main__":
    main()
