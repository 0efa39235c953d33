"""``scripts/multinode.sh`` as typed, on a two-node Ray cluster made of two network namespaces of this
machine (each its own address on a veth pair, so that Ray, gloo and the retriever cross a real link
and loopback is not the other node): head, worker, submit (the from-every-node checks, one training
step with the preset and the CPU overlay, both ranks' shards in the shared checkpoint folder), then a
second submit that resumes from it with a retriever replica on each node (``ROLE=retriever``,
``RETRIEVER_URL='http://{node_ip}:8000/retrieve'``): each replica's /health shows searches from its own
node and no other's (a replica over another index is refused first). Needs root and iproute2 (CI has
both); skipped elsewhere, never on CI."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from train.trainer import checkpoint_store

pytestmark = pytest.mark.slow  # make test-fast leaves these out

ROOT = Path(__file__).resolve().parent.parent
# RFC 2544's benchmarking range: addresses of this test's own two hosts, inside namespaces it makes
HEAD_IP, WORKER_IP = "198.18.213.1", "198.18.213.2"
IFACE = "rnode"  # the veth end's name in both namespaces (GLOO_SOCKET_IFNAME names it on every node)


def sh(*args, check=True, **kw):
    return subprocess.run([str(a) for a in args], check=check, capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def nodes():
    if os.geteuid() != 0 or not shutil.which("ip"):
        if os.environ.get("CI"):
            pytest.fail("the multi-node test needs root and iproute2 (ip netns), as CI has")
        pytest.skip("needs root and iproute2 to make network namespaces")
    names = (f"srhead{os.getpid()}", f"srwork{os.getpid()}")
    try:
        for ns in names:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "srv0", "type", "veth", "peer", "name", "srv1")
        for ns, end, ip in zip(names, ("srv0", "srv1"), (HEAD_IP, WORKER_IP)):
            sh("ip", "link", "set", end, "netns", ns)
            sh("ip", "-n", ns, "link", "set", end, "name", IFACE)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", IFACE)
            sh("ip", "-n", ns, "link", "set", IFACE, "up")
        if shutil.which("ping"):
            sh("ip", "netns", "exec", names[1], "ping", "-c", "1", "-W", "5", HEAD_IP)
        yield names
    finally:
        from tests.conftest import stop_ray_processes

        # this cluster's processes only (every one names the head's address); `ray stop --force` would
        # kill every Ray process of the machine, a cluster the user runs beside this test included
        stop_ray_processes(HEAD_IP)
        for ns in names:
            sh("ip", "netns", "del", ns, check=False)


def in_ns(ns, env, *cmd, log: Path, timeout=1200, check=True):
    import time

    from tests.conftest import record_journey

    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run(["ip", "netns", "exec", ns, "env", *[f"{k}={v}" for k, v in env.items()], *map(str, cmd)],
                           cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text(errors="replace")
    record_journey(["(node", ns + ")", *cmd], env, r.returncode, time.time() - t0, text)
    if check:
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode} in {ns}:\n{text[-6000:]}"
    return r.returncode, text


def test_multinode_sh_trains_resumes_on_two_nodes(nodes, tmp_path, learn_task, corpus_path):
    """The policy is the learnable task's warm start (tests/conftest.py), which searches in its first turn:
    the resumed step's searches show on each node's replica."""
    head, worker = nodes
    replica_pid = None
    data = tmp_path / "data"  # what prep writes: train.parquet and val_sample.parquet
    data.mkdir()
    shutil.copy(learn_task / "data" / "train.parquet", data / "train.parquet")
    shutil.copy(learn_task / "data" / "test.parquet", data / "val_sample.parquet")
    corpus = learn_task / "corpus.jsonl"
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "REHEARSAL": "cpu", "N_GPUS": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "RAY_DEDUP_LOGS": "0",
            "PYTHON": sys.executable}
    # the retriever on the head's address (multinode.sh refuses a loopback URL: other nodes cannot reach it)
    retriever = subprocess.Popen(
        ["ip", "netns", "exec", head, "env", *[f"{k}={v}" for k, v in base.items()], f"HOST={HEAD_IP}", "PORT=8000",
         "RETRIEVER=bm25", f"INDEX_ROOT={tmp_path / 'index'}", f"CORPUS={corpus}", "bash", "retrieval_launch.sh"],
        cwd=ROOT, stdout=open(tmp_path / "retriever.log", "w"), stderr=subprocess.STDOUT)

    def start_replica(index_root, corpus, name):  # ROLE=retriever on the worker node; returns its pid
        _, text = in_ns(worker, {**base, "ROLE": "retriever", "NODE_IP": WORKER_IP, "RETRIEVER": "bm25",
                                 "INDEX_ROOT": index_root, "CORPUS": corpus, "RETRIEVER_LOG": tmp_path / f"{name}.log"},
                        "bash", "scripts/multinode.sh", log=tmp_path / f"{name}.start.log", timeout=400)
        assert f"retriever replica: http://{WORKER_IP}:8000" in text, text[-3000:]
        return int(re.search(r"\(pid (\d+),", text).group(1))

    try:
        in_ns(head, base, sys.executable, "-m", "retrieval.client", f"http://{HEAD_IP}:8000", "--wait", "300", "--pid",
              retriever.pid, log=tmp_path / "wait.log", timeout=400)
        in_ns(head, {**base, "ROLE": "head", "NODE_IP": HEAD_IP}, "bash", "scripts/multinode.sh",
              log=tmp_path / "head.log", timeout=300)
        in_ns(worker, {**base, "ROLE": "worker", "HEAD": HEAD_IP, "NODE_IP": WORKER_IP}, "bash", "scripts/multinode.sh",
              log=tmp_path / "worker.log", timeout=300)
        submit = {**base, "ROLE": "submit", "NNODES": "2", "PRESET": "grpo_llds", "MODEL": learn_task / "model",
                  "RETRIEVER_URL": f"http://{HEAD_IP}:8000/retrieve", "CKPT_DIR": tmp_path / "ckpt",
                  "DATA_DIR": data, "GLOO_SOCKET_IFNAME": IFACE}
        _, text = in_ns(head, submit, "bash", "scripts/multinode.sh", "trainer.total_training_steps=1",
                        log=tmp_path / "submit1.log")
        assert text.count("retriever 200, missing paths none") == 2, text[-4000:]  # checked from both nodes
        assert "rehearsal (cpu): grpo_llds with" in text and "on 2 nodes x 1" in text
        assert "actor_rollout_ref.rollout.agent.num_workers=2" in text  # an agent worker on each node
        assert "ray: joining the Ray cluster" in text and "step:1 " in text, text[-4000:]
        step1 = tmp_path / "ckpt" / "global_step_1"
        assert checkpoint_store.problems(str(step1)) == []
        assert sorted(p.name for p in (step1 / "actor").glob("model_world_size_2_rank_*.pt")) == \
            ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
        per_node = {**submit, "RETRIEVER_URL": "http://{node_ip}:8000/retrieve"}
        # a replica over another corpus: the submit step refuses before training (the replicas must agree)
        replica_pid = start_replica(tmp_path / "other_index", corpus_path, "wrong_replica")
        rc, text = in_ns(head, per_node, "bash", "scripts/multinode.sh", "trainer.total_training_steps=2",
                         log=tmp_path / "submit_refused.log", check=False)
        assert rc != 0 and "error: the retriever replicas serve different indexes" in text, text[-4000:]
        assert "step:" not in text and checkpoint_store.read_tracker(str(tmp_path / "ckpt")) == (1, None)
        stop(replica_pid)
        # the resumed run searches a retriever replica on each node: the head's (the one above, on its
        # address) and the worker's, over the same index; every rollout asks its own node's
        replica_pid = start_replica(tmp_path / "index", corpus, "replica")
        head_before = health(head, HEAD_IP, tmp_path)["clients"]
        _, text = in_ns(head, per_node, "bash", "scripts/multinode.sh", "trainer.total_training_steps=2",
                        log=tmp_path / "submit2.log")
        assert f"checkpoints: resuming from {step1}" in text and "step:2 " in text, text[-4000:]
        for ip in (HEAD_IP, WORKER_IP):  # the from-every-node check asked each node's own replica
            assert f"(http://{ip}:8000/health): retriever 200, missing paths none" in text, text[-4000:]
        on_head = {a: n - head_before.get(a, 0) for a, n in health(head, HEAD_IP, tmp_path)["clients"].items()}
        on_head = {a: n for a, n in on_head.items() if n}
        on_worker = health(worker, WORKER_IP, tmp_path)["clients"]
        # each replica served its own node's rollouts, and only those
        assert set(on_head) == {HEAD_IP} and set(on_worker) == {WORKER_IP}, (on_head, on_worker)
        print(f"searches of the resumed step: head replica {on_head}, worker replica {on_worker}")
        assert checkpoint_store.read_tracker(str(tmp_path / "ckpt")) == (2, None)
        assert checkpoint_store.problems(str(tmp_path / "ckpt" / "global_step_2")) == []
        # the metrics file is on the shared checkpoint folder (not the job's temporary working dir) and
        # the resumed job appended to it
        from train.trainer.metrics_file import read_metrics

        steps = read_metrics(tmp_path / "ckpt" / "metrics.jsonl")
        assert [s for s in sorted(steps) if "critic/score/mean" in steps[s]] == [1, 2], sorted(steps)
    finally:
        retriever.kill()
        if replica_pid:
            stop(replica_pid)


def stop(pid, wait=60.0):
    """SIGTERM a replica (retrieval.server drains and exits) and wait until its port is free."""
    import time

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + wait
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)


def health(ns, ip, tmp_path) -> dict:
    """A retriever's /health, asked from inside the namespace that reaches it."""
    import json

    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                        f"import httpx; print(httpx.get('http://{ip}:8000/health', timeout=30).text)"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
