"""bench/refresh_results.py: RESULTS.md's replay and SmolLM2 study tables are what their commands print today
(a recorded run that was not followed by a refresh fails here), and a stale or damaged block is named."""

import subprocess
import sys

import pytest

from bench import refresh_results


def test_results_md_holds_what_the_replay_and_the_study_print():
    r = subprocess.run([sys.executable, "bench/refresh_results.py", "--check"], cwd=refresh_results.ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_stale_table_is_rewritten_and_a_lost_block_is_named():
    text = refresh_results.RESULTS.read_text()
    section = text.index(refresh_results.SMOLLM2_SECTION)
    row = next(ln for ln in text[section:].splitlines() if ln.startswith("| GRPO+LLDS | "))
    stale = text[:section] + text[section:].replace(row, "| GRPO+LLDS | 9 | made up |", 1)
    assert refresh_results.refreshed(stale) == text
    with pytest.raises(SystemExit, match="SmolLM2 study block was not found"):
        refresh_results.refreshed(text.replace(refresh_results.CURVES, "(the plot)"))
