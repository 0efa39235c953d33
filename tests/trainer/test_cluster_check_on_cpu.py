"""`python -m train.cluster_check` (multinode.sh's submit probe): what makes it refuse, and its error
without a cluster. Its run against two real Ray nodes is tests/test_multinode_on_cpu.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from train.trainer.cluster_probe import NodeReport, health_url, problems

ROOT = Path(__file__).resolve().parents[2]


def test_problems_name_the_node_and_the_index():
    ok = NodeReport("a (u)", 200, (), ("bm25", 3, 3, "x"))
    assert problems([ok, NodeReport("b (u)", 200, (), ("bm25", 3, 3, "x"))]) == []
    down = problems([ok, NodeReport("b (u)", "ConnectError()", ("/shared/ckpt",), None)])
    assert down[0] == "retriever unreachable or shared paths missing on ['b (u)']"
    assert "serve different indexes" in down[1] and "b (u): None" in down[1]
    assert health_url("http://h:8000/retrieve") == "http://h:8000/health"


def test_without_a_cluster_it_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(tmp_path)  # no session of another run to join
    r = subprocess.run([sys.executable, "-m", "train.cluster_check", "http://127.0.0.1:9/retrieve", str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "error: no Ray cluster to check from here" in r.stderr and "ROLE=head" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
