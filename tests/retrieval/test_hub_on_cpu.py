"""`python -m retrieval.hub`: what scripts/download_wiki18.sh calls per asset (its journey with a fake hub is
tests/test_gpu_path_on_cpu.py::test_bm25_lands_where_lucene_serves_it). Offline, a download fails at once
with one line naming the asset, and the script stops there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_offline_download_fails_naming_the_asset(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "retrieval.hub", "PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz",
                        str(tmp_path / "w")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: downloading wiki-18.jsonl.gz of PeterJinGo/wiki-18-corpus into"), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    r = subprocess.run(["bash", "scripts/download_wiki18.sh", str(tmp_path / "w"), "corpus"], cwd=ROOT,
                       env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error: downloading wiki-18.jsonl.gz" in r.stderr, r.stderr
    assert not (tmp_path / "w" / "wiki-18.jsonl").exists()
