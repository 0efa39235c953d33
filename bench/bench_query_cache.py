"""Repeated queries searched once: the server with its result cache against the same server without it.

    python bench/bench_query_cache.py                        # shares 0, 25, 50 %, 32 clients
    python bench/bench_query_cache.py --shares 0 50 --questions 64 --samples 5 --clients 32

A GRPO step sends the searches of n samples per question at about the same time, and the samples of
one question often search the same words. This replays such a stream against a MiniLM index of the
bundled corpus (built on first use under runs/bench/minilm): ``--questions`` questions x ``--samples``
samples, one query per request (as the rollouts send them), the samples of a question in flight
together. Of each question's samples, the first asks the question's own text, ``share`` of them
(rounded) ask it again and the others a wording of their own, so a share of 0 has no repeats at all
(the cost of the cache's bookkeeping); the table prints the share the stream really has. For each share it serves
the same stream with ``--cache-mb 0`` and with the cache (256
MiB), each on a fresh server in this process, the load generator in a child process, and prints
queries/s, p50 and p99 latency and the ratio, with the rows that reached the index (``/health``).
Within-batch sharing is on in both: it is not a setting.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_retrieval import ensure_index  # noqa: E402

QA = ROOT / "data" / "qa.jsonl"


def stream(n_questions: int, samples: int, share: float) -> list[str]:
    """Question by question, each question's samples next to each other."""
    qs = [json.loads(line)["question"] for line in open(QA)][:n_questions]
    if len(qs) < n_questions:
        raise SystemExit(f"--questions {n_questions}: {QA} has only {len(qs)}")
    repeats = min(samples - 1, round(share * samples))  # samples 1..repeats ask what sample 0 asked
    out = []
    for i, q in enumerate(qs):
        for s in range(samples):
            out.append(q if s <= repeats else f"{q.rstrip('?')} (sample {s} of question {i})")
    return out


def _load(url: str, clients: int, queries: list[str]) -> dict:
    """Client c sends queries c, c + clients, ...: the samples of a question go out together."""
    import http.client
    from urllib.parse import urlparse

    host, port = urlparse(url).hostname, urlparse(url).port
    lat: list[float] = []
    lock = threading.Lock()

    def client(c):
        conn = http.client.HTTPConnection(host, port, timeout=120)
        mine = []
        for q in queries[c::clients]:
            t = time.perf_counter()
            conn.request("POST", "/retrieve", body=json.dumps({"queries": [q], "topk": 3}),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat.sort()
    return {"qps": len(lat) / wall, "p50": lat[len(lat) // 2] * 1e3,
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3}


def load_run(url: str, clients: int, queries: list[str]) -> dict:
    code = ("import json,sys; sys.path.insert(0, %r); from bench.bench_query_cache import _load; "
            "print(json.dumps(_load(*json.loads(sys.stdin.read()))))" % str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], input=json.dumps([url, clients, queries]),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def served(retriever, cache_mb: int, clients: int, queries: list[str]) -> dict:
    import httpx

    from retrieval.app import create_app
    from retrieval.serving import Server
    from retrieval.settings import ServeConfig, ServerConfig

    app = create_app(retriever, ServerConfig(max_batch=256, cache_bytes=cache_mb << 20))
    srv = Server(app, ServeConfig(port=0, threads=max(64, clients + 32)), quiet=True).start()
    url = srv.url
    try:
        out = load_run(url, clients, queries)
        health = httpx.get(url + "/health", timeout=30).json()
        out["searched"] = health["queries"]
        return out
    finally:
        srv.stop()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shares", type=float, nargs="+", default=[0, 25, 50], help="repeated share of each "
                    "question's samples, in percent")
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--index", type=Path, default=ROOT / "runs" / "bench" / "minilm")
    args = ap.parse_args(argv)
    bad = [s for s in args.shares if not 0 <= s <= 100]
    if bad:
        ap.error(f"--shares are percentages from 0 to 100, got {bad}")
    if min(args.questions, args.samples, args.clients) < 1:
        ap.error("--questions, --samples and --clients must be >= 1")
    from retrieval.index import load_retriever

    retriever = load_retriever(str(ensure_index(args.index)))
    served(retriever, 0, args.clients, stream(4, args.samples, 0))  # warm the encoder
    print(f"MiniLM index of the bundled corpus, {args.questions} questions x {args.samples} samples, one query per "
          f"request, {args.clients} clients, topk 3, max_batch 256")
    print("| repeated share | cache | queries/s | p50 ms | p99 ms | rows searched | queries/s ratio | p99 ratio |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for share in args.shares:
        queries = stream(args.questions, args.samples, share / 100)
        real = 1 - len(set(queries)) / len(queries)
        off = served(retriever, 0, args.clients, queries)
        on = served(retriever, 256, args.clients, queries)
        for name, r in (("off", off), ("256 MiB", on)):
            ratio = (f"{on['qps'] / off['qps']:.2f}x", f"{on['p99'] / off['p99']:.2f}x") if r is on else ("", "")
            print(f"| {real:.0%} | {name} | {r['qps']:.0f} | {r['p50']:.1f} | {r['p99']:.1f} | "
                  f"{r['searched']} of {len(queries)} | {ratio[0]} | {ratio[1]} |", flush=True)


if __name__ == "__main__":
    main()
