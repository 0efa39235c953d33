"""Retrieval benchmarks (not tests): baseline and candidate in the same process, ratios printed.

    python bench/bench_retrieval.py                      # all parts
    python bench/bench_retrieval.py --parts concurrency,encoder --requests 100
    python bench/bench_retrieval.py --parts scale --scale-n 1000000

Parts:
- concurrency: N concurrent clients sending single-query requests to the server over the bundled
  corpus (dense MiniLM), micro-batching on (max batch 256) vs off (max batch 1, same server code).
- encoder: encoder-only query throughput at batch 256; server QPS at 64 clients as a fraction of it.
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


def load_run(url: str, n_clients: int, requests_each: int, qs: list[str]) -> dict:
    """The load generator runs in its own process (no GIL shared with the server)."""
    code = ("import json,sys; sys.path.insert(0, %r); from bench.bench_retrieval import _load; "
            "print(json.dumps(_load(*json.loads(sys.stdin.read()))))" % str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps([url, n_clients, requests_each, qs]),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _load(url: str, n_clients: int, requests_each: int, qs: list[str]) -> dict:
    """Keep-alive http.client connections: a light client, so the server gets the CPU."""
    import http.client
    from urllib.parse import urlparse

    host, port = urlparse(url).hostname, urlparse(url).port
    lat: list[float] = []
    lock = threading.Lock()

    def client(i):
        conn = http.client.HTTPConnection(host, port, timeout=120)
        mine = []
        for j in range(requests_each):
            body = json.dumps({"queries": [qs[(i * requests_each + j) % len(qs)]], "topk": 3})
            t = time.perf_counter()
            conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            mine.append(time.perf_counter() - t)
        conn.close()
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


def serve(retriever, max_batch: int):
    from waitress.server import create_server

    from retrieval.server import ServerConfig, create_app
    from tests.conftest import free_port

    app = create_app(retriever, ServerConfig(max_batch=max_batch))
    port = free_port()
    srv = create_server(app, host="127.0.0.1", port=port, threads=80)
    threading.Thread(target=srv.run, daemon=True).start()
    return srv, app, f"http://127.0.0.1:{port}"


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
        srv.close()
        app.batcher.close()
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
    ap.add_argument("--parts", default="concurrency,encoder,scale,build")
    ap.add_argument("--index", default=str(ROOT / "runs" / "index" / "minilm"))
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--requests", type=int, default=40, help="requests per client")
    ap.add_argument("--scale-n", type=int, default=1_000_000)
    ap.add_argument("--build-n", type=int, default=1024)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts & {"concurrency", "encoder"}:
        part_concurrency_and_encoder(args, parts)
    if "scale" in parts:
        part_scale(args)
    if "build" in parts:
        part_build(args)


if __name__ == "__main__":
    main()
