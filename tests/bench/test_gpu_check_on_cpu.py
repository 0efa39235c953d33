"""bench/gpu_check.sh, the prepared GPU check, in its CPU dry mode: every part runs and passes; a
broken path is reported as a mismatch with a non-zero exit; bad --parts is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


@pytest.mark.slow
def test_dry_mode_runs_every_part():
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    table = r.stdout[r.stdout.index("part "):]
    for part in ("fork", "hf_kv", "flat", "logprobs", "attention", "critic"):
        assert f"\n{part} " in table, part
    assert "MISMATCH" not in table and " 0 mismatches" in r.stdout


def test_a_broken_path_is_a_mismatch(monkeypatch, capsys):
    from bench import gpu_check
    from retrieval.flat import TorchFlatIndex

    real = TorchFlatIndex.search

    def reversed_order(self, queries, k):
        s, i = real(self, queries, k)
        return s[:, ::-1].copy(), np.ascontiguousarray(i[:, ::-1])

    monkeypatch.setattr(TorchFlatIndex, "search", reversed_order)
    assert gpu_check.main(["--cpu", "--parts", "flat"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_bad_parts_are_refused():
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "--cpu", "--parts", "flat,nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--parts: unknown nope" in r.stderr
