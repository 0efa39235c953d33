"""After the suite, nothing of ours is left on the machine: no Ray cluster, server, engine or command
still running, no network namespace of the multi-node test, and no Ray address file naming a dead
cluster (tests/leftovers.py). The check runs last (the ``last`` marker, ordered by tests/conftest.py);
the first test shows it finds each kind of leftover."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import leftovers
from tests.conftest import ROOT, SESSION_START, free_port, stop_ray_processes


def test_the_check_finds_a_process_a_namespace_and_a_stale_ray_address(tmp_path, monkeypatch):
    t0 = time.time()
    # a process of ours: its command line names the retriever, as `python -m retrieval.server` does
    proc = subprocess.Popen(["bash", "-c", "exec -a 'python -m retrieval.server --port 1' sleep 60"])
    try:
        for _ in range(50):
            if any(line.startswith(f"{proc.pid}:") for line in leftovers.processes_since(t0)):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the check missed pid {proc.pid}: {leftovers.processes_since(t0)}")
        assert not [p for p in leftovers.processes_since(time.time() + 60)], "a process started before t0 counted"
    finally:
        proc.kill()
        proc.wait()
    assert not [p for p in leftovers.processes_since(t0) if p.startswith(f"{proc.pid}:")]

    # Ray's address file naming a port where nothing listens, then removed the way the tests stop a cluster
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    dead = f"127.0.0.1:{free_port()}"
    leftovers.ray_address_file().write_text(dead)
    assert leftovers.stale_ray_address() == dead
    assert any("no Ray cluster answers" in line for line in leftovers.left_behind(time.time()))
    stop_ray_processes(dead)  # nothing runs there; the file goes
    assert not leftovers.ray_address_file().exists() and leftovers.stale_ray_address() is None

    # a namespace of the multi-node test's names (only where this machine lets us make one, as on CI)
    ns = f"srhead{free_port()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode == 0:
        try:
            assert ns in leftovers.namespaces()
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        assert ns not in leftovers.namespaces()


def test_a_bad_suite_start_is_named():
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/test_nothing_left_on_cpu.py"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "SUITE_START": "yesterday"}, timeout=120)
    assert r.returncode != 0 and "SUITE_START='yesterday': expected the suite's start" in r.stdout + r.stderr, \
        (r.stdout + r.stderr)[-2000:]


@pytest.mark.last
def test_nothing_of_ours_is_left_after_the_suite():
    # a process killed by its test may take a moment to go (SIGKILL of a Ray worker's process group)
    deadline = time.time() + 20
    while (left := leftovers.left_behind(SESSION_START)) and time.time() < deadline:
        time.sleep(1)
    assert not left, "left behind by the tests:\n" + "\n".join(left)
