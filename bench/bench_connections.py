"""Connection exhaustion and oversized bodies: a bounded load test of the retrieval server on 127.0.0.1.

    python bench/bench_connections.py [--idle 1000] [--slow 200] [--seconds 30]

Two servers over the same BM25 index in this process, each hit the same way:
- baseline: waitress as the server ran before (connection_limit 1000, channel_timeout 300 s, no
  request-body bound: waitress spools bodies up to 1 GiB to a temp file before the app's 4 MiB check);
- candidate: ``retrieval.serving.Server`` (connection_limit 4096, channel_timeout 10 s, bodies over
  the app's limit refused from their Content-Length).

Load: ``--idle`` connections that send nothing and ``--slow`` slowloris connections (a request head
trickled one byte every 2 s) are opened first; then a normal client sends one request a second for
``--seconds`` seconds. Printed: the normal client's successes and latency, how many idle connections
the server had closed by the end, and (on a fresh server of the same kind) the time and bytes a
300 MB body upload got in before the server answered (at most 20 s). Every loop is bounded in count and time;
only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def start(kind: str, app):
    from waitress.server import create_server

    from retrieval.app import state_of
    from retrieval.serving import Server
    from retrieval.settings import ServeConfig

    if kind == "baseline":
        server = create_server(app, host="127.0.0.1", port=0, threads=64, connection_limit=1000,
                               channel_timeout=300, ident="retrieval")
        threading.Thread(target=server.run, daemon=True).start()

        def close():
            server.close()
            state_of(app).close()
        return close, server.effective_port
    server = Server(app, ServeConfig(port=0, threads=64)).start()
    return server.stop, server.port


def open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    return socks


def slowloris(port: int, n: int, stop: threading.Event) -> list[socket.socket]:
    socks = open_idle(port, n)
    head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"

    def drip():
        i = 0
        while not stop.is_set() and i < len(head):
            for s in socks:
                try:
                    s.send(head[i: i + 1])
                except OSError:
                    pass
            i += 1
            stop.wait(2.0)

    threading.Thread(target=drip, daemon=True).start()
    return socks


def normal_client(port: int, seconds: float) -> tuple[int, int, list[float]]:
    import httpx

    ok = total = 0
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        total += 1
        t0 = time.perf_counter()
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": ["Harvey Pekar"]}, timeout=3)
            if r.status_code == 200:
                ok += 1
                lat.append((time.perf_counter() - t0) * 1000)
        except httpx.HTTPError:
            pass
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
    return ok, total, lat


def closed_by_server(socks: list[socket.socket]) -> int:
    n = 0
    for s in socks:
        try:
            s.setblocking(False)
            if s.recv(1) == b"":
                n += 1
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def big_body(port: int, claimed: int = 300_000_000, limit_s: float = 20.0) -> tuple[float, int, str]:
    """Upload up to ``claimed`` bytes (bounded by ``limit_s``); returns seconds until the server
    answered (or the limit), bytes sent, and the status line."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {claimed}\r\n\r\n".encode())
    chunk = b"x" * (1 << 20)
    sent, t0, status = 0, time.perf_counter(), "(no answer)"
    s.setblocking(False)
    while sent < claimed and time.perf_counter() - t0 < limit_s:
        try:
            data = s.recv(200)
            if data:
                status = data.split(b"\r\n")[0].decode(errors="replace")
                break
            status = "(closed)"
            break
        except BlockingIOError:
            pass
        try:
            sent += s.send(chunk)
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            status = "(closed while sending)"
            break
    dt = time.perf_counter() - t0
    s.close()
    return dt, sent, status


def run(kind: str, retriever, args) -> dict:
    from retrieval.app import create_app
    from retrieval.settings import ServerConfig

    app = create_app(retriever, ServerConfig())
    close, port = start(kind, app)
    stop = threading.Event()
    idle = open_idle(port, args.idle)
    slow = slowloris(port, args.slow, stop)
    ok, total, lat = normal_client(port, args.seconds)
    closed = closed_by_server(idle)
    stop.set()
    for s in idle + slow:
        s.close()
    close()
    # the body test on a fresh server of the same kind (the loaded one may not have survived)
    close, port = start(kind, create_app(retriever, ServerConfig()))
    dt, sent, status = big_body(port)
    close()
    return {"ok": ok, "total": total, "p50": statistics.median(lat) if lat else float("nan"),
            "max": max(lat) if lat else float("nan"), "idle_opened": len(idle), "idle_closed": closed,
            "body_s": dt, "body_mb": sent / 1e6, "body_status": status}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    if not (0 <= args.idle <= 5000 and 0 <= args.slow <= 2000 and 1 <= args.seconds <= 300):
        ap.error("bounded load only: --idle <= 5000, --slow <= 2000, --seconds in [1, 300]")
    import tempfile

    from retrieval.bm25 import build_bm25
    from retrieval.index import load_retriever
    from retrieval.serving import raise_open_files

    raise_open_files(4 * (args.idle + args.slow) + 512)
    with tempfile.TemporaryDirectory() as tmp:
        build_bm25(str(ROOT / "data" / "corpus.jsonl"), tmp, progress=False)
        retriever = load_retriever(tmp)
        rows = {k: run(k, retriever, args) for k in ("baseline", "candidate")}
    print(f"{args.idle} idle + {args.slow} slowloris connections, then 1 request/s for {args.seconds:g} s")
    print("| server | normal requests ok | p50 ms | max ms | idle conns closed by server | 300 MB body: answer "
          "| after s | MB sent |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for k, r in rows.items():
        print(f"| {k} | {r['ok']}/{r['total']} | {r['p50']:.1f} | {r['max']:.1f} | {r['idle_closed']}/"
              f"{r['idle_opened']} | {r['body_status']} | {r['body_s']:.2f} | {r['body_mb']:.0f} |")
    b, c = rows["baseline"], rows["candidate"]
    print(f"ratios (candidate / baseline): requests ok {c['ok'] / max(b['ok'], 1):.1f}x; "
          f"body bytes accepted {c['body_mb'] / max(b['body_mb'], 1e-9):.4f}x")


if __name__ == "__main__":
    main()
