"""The retrieval parts: flat (retrieval/flat.py's fp16 shards against exact fp32 search) and threads (the
retrieval server's batching engine keeps every search, and so every cuBLAS workspace, on its one thread)."""

from __future__ import annotations

import time
from pathlib import Path

from train.gpucheck.environment import MiB, blas_workspace, memory, sync
from train.gpucheck.report import Report

# -- flat -----------------------------------------------------------------------------------------------

def part_flat(rep: Report, device: str, work: Path, n: int, d: int = 768, queries: int = 256, k: int = 10) -> None:
    import torch

    from retrieval.flat import TorchFlatIndex

    g = torch.Generator(device="cpu").manual_seed(0)
    vec = torch.randn(n, d, generator=g).half()  # what the fp16 shards hold, exactly
    q = torch.randn(queries, d, generator=g).numpy()
    shard = vec.to(device)
    index = TorchFlatIndex([shard])
    modes = list(getattr(index, "modes", []))  # how each shard scores in fp32 ("split": torch.mm to fp32 on CUDA)
    rep.add("flat", "fp32 scoring mode per shard (CUDA: split expected, upcast is slower)",
            ",".join(map(str, modes)) or "?", None)
    s, i = index.search(q, k)  # warm-up and the result
    # exact fp32 reference over the same (fp16-valued) vectors: fp32 products, no TF32
    prev = torch.backends.cuda.matmul.allow_tf32 if device.startswith("cuda") else None
    if prev is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    ref_s, ref_i = [], []
    qt = torch.from_numpy(q).to(device)
    for lo in range(0, queries, 64):
        sc = qt[lo:lo + 64] @ shard.float().T if n * d <= (1 << 26) else torch.cat(
            [qt[lo:lo + 64] @ shard[j:j + (1 << 18)].float().T for j in range(0, n, 1 << 18)], 1)
        a, b = torch.topk(sc, k, dim=1)
        ref_s.append(a.cpu())
        ref_i.append(b.cpu())
    if prev is not None:
        torch.backends.cuda.matmul.allow_tf32 = prev
    ref_s, ref_i = torch.cat(ref_s).numpy(), torch.cat(ref_i).numpy()
    same = (i == ref_i)
    # a differing id is acceptable only as a tie (equal fp32 scores in both)
    ties = (~same) & (abs(s - ref_s) <= 1e-5 * abs(ref_s).max())
    rep.add("flat", f"top-{k} ids and order vs exact fp32 ({n:,} x {d})",
            f"{same.mean() * 100:.3f}% identical, {int((~same & ~ties).sum())} real differences",
            bool((same | ties).all()))
    err = float(abs(s - ref_s).max())
    rep.add("flat", "max |score - fp32 score|", f"{err:.2e}", err <= 1e-3)
    reps = 5
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        index.search(q, k)
    sync(device)
    rep.add("flat", f"throughput, batches of {queries}", f"{reps * queries / (time.perf_counter() - t0):,.0f} q/s",
            None)


# -- threads --------------------------------------------------------------------------------------------

#: device memory the batched load may add beyond one thread's cuBLAS workspace (the stand-in's matmul blocks
#: are freed and reused; the workspace of a second thread doing device work is 8-32 MiB)
THREADS_SLACK = 4 * MiB


class DeviceRetriever:
    """A stand-in retriever (``search(queries, k) -> rows of (doc, score)``) whose search runs a matmul on the
    device, as the encoder and the index do, and records the name of the thread it ran on."""

    def __init__(self, device: str, dim: int = 256):
        import threading

        import torch

        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(dim, dim, generator=g).to(device)
        self.b = torch.randn(dim, dim, generator=g).to(device)
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[tuple[dict, float]]]:
        import threading

        with self._lock:
            self.threads.append(threading.current_thread().name)
        score = float((self.a @ self.b).sum())  # one cuBLAS matmul on this thread (fixed size), then a sync
        return [[({"id": f"{q}/{j}", "contents": q}, score - j) for j in range(k)] for q in queries]


def drive_clients(search, short: int = 64, pooled: int = 16, per_pooled: int = 4, topk: int = 3,
                  timeout: float = 300.0) -> dict:
    """Requests of 1-4 queries from ``short`` short-lived threads (one request each; they wait for each other
    before they end, so all are alive at once, as in a burst on a thread-per-request server) and ``pooled``
    pooled threads (``per_pooled`` requests in all per thread on average, at least one each), all at the same
    time; ``search(queries, topk)`` returns the rows. Returns {requests, clients (distinct client thread names),
    errors}."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    errors: list[str] = []
    clients: set[str] = set()
    lock = threading.Lock()

    def one(i: int) -> None:
        with lock:
            clients.add(threading.current_thread().name)
        queries = [f"request {i} query {j}" for j in range(1 + i % 4)]
        try:
            rows = search(queries, topk)
            good = len(rows) == len(queries) and all(
                len(r) == topk and r[0][0]["contents"] == q for r, q in zip(rows, queries))
            if not good:
                raise AssertionError(f"wrong rows for request {i}")
        except Exception as e:  # noqa: BLE001
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    def then_wait(barrier: threading.Barrier):
        def run(i: int) -> None:
            one(i)
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
        return run

    short_lived = then_wait(threading.Barrier(short, timeout=timeout))
    # each pool thread's first request waits for the others' before the pool takes more: the executor starts
    # all ``pooled`` threads (it starts one per submit only while none is idle) and each serves >= 1 request
    pool_first = then_wait(threading.Barrier(pooled, timeout=timeout))
    threads = [threading.Thread(target=short_lived, args=(i,), name=f"client-short-{i}", daemon=True)
               for i in range(short)]
    with ThreadPoolExecutor(pooled, thread_name_prefix="client-pool") as pool:
        for t in threads:
            t.start()
        futures = [pool.submit(pool_first, short + i) for i in range(pooled)]
        futures += [pool.submit(one, short + i) for i in range(pooled, pooled * per_pooled)]
        for f in futures:
            f.result(timeout=timeout)
    for t in threads:
        t.join(timeout=timeout)
    if any(t.is_alive() for t in threads):
        errors.append("client threads still running after the timeout")
    return {"requests": short + pooled * per_pooled, "clients": clients, "errors": errors}


def part_threads(rep: Report, device: str, short: int = 64, pooled: int = 16, per_pooled: int = 4) -> None:
    import torch

    from retrieval import batching

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()  # cached free segments would hide new reserved memory
    ws = blas_workspace() if cuda else None
    retriever = DeviceRetriever(device)
    b = batching.MicroBatcher(retriever)  # the server's default settings: batches of up to 256 queries
    try:
        b.search(["warm-up"], 3, timeout=120)  # the batcher thread's first matmul: its workspace, before the baseline
        retriever.threads.clear()
        alloc0, res0 = memory(device)
        load = drive_clients(lambda q, k: b.search(q, k, timeout=120), short, pooled, per_pooled)
        alloc1, res1 = memory(device)
        name = b.thread_name
    finally:
        b.close()
    ran = sorted(set(retriever.threads))
    n_clients = len(load["clients"])
    where = (f"all on {name!r}" if ran == [name] else
             f"on {len(ran)} threads: {', '.join(ran[:4])}{', ...' if len(ran) > 4 else ''} (batcher: {name!r})")
    rep.add("threads", f"{load['requests']} requests from {n_clients} client threads ({short} short-lived, "
                       f"{pooled} pooled): where the searches ran",
            f"{len(retriever.threads)} searches, {where}", ran == [name] and len(retriever.threads) > 0)
    rep.add("threads", "every request got its own rows",
            "yes" if not load["errors"] else f"{len(load['errors'])} failed: {load['errors'][0][:100]}",
            not load["errors"])

    # the baseline: the same load, each client thread searching itself (the server before the batching engine)
    direct = DeviceRetriever(device)
    d_alloc0, d_res0 = memory(device)
    base = drive_clients(direct.search, short, pooled, per_pooled)
    d_alloc1, d_res1 = memory(device)
    searched = len(set(direct.threads))
    failed = f"; {len(base['errors'])} of its requests failed: {base['errors'][0][:80]}" if base["errors"] else ""
    if not cuda:
        rep.add("threads", "memory growth, batched vs on each client thread",
                f"n/a on CPU (no cuBLAS workspace); the baseline searched on {searched} client threads{failed}", None)
        return
    grow = max(alloc1 - alloc0, res1 - res0)
    d_grow = max(d_alloc1 - d_alloc0, d_res1 - d_res0)
    limit = ws.per_thread + THREADS_SLACK
    rep.add("threads", "device memory growth under the load, batched (allocated / reserved)",
            f"{(alloc1 - alloc0) / MiB:.1f} / {(res1 - res0) / MiB:.1f} MiB (bound: one thread's workspace "
            f"{ws.per_thread / MiB:.1f} + {THREADS_SLACK / MiB:.0f} MiB)", grow <= limit)
    rep.add("threads", "baseline, the search on each client thread (old behaviour): allocated / reserved",
            f"{(d_alloc1 - d_alloc0) / MiB:.1f} / {(d_res1 - d_res0) / MiB:.1f} MiB over {searched} threads = "
            f"{(d_alloc1 - d_alloc0) / max(searched, 1) / MiB:.1f} MiB each (torch's per thread: {ws.describe()})"
            f"{failed}", None)
    rep.add("threads", "growth on client threads / batched",
            f"{d_grow / MiB:.1f} / {grow / MiB:.1f} MiB = "
            + (f"{d_grow / grow:.0f}x" if grow >= MiB else f">= {d_grow / MiB:.0f}x (batched < 1 MiB)"), None)
    # the baseline's workspaces stay in torch's (handle, stream) map for the process: free them for what follows
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()

