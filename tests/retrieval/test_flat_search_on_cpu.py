"""GPU retrieval without faiss-gpu: exact flat search in torch (retrieval/flat.py), checked on CPU
against FAISS's own exact search; the start-up capability check; the launcher that stops waiting for a
retriever that died."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from retrieval.flat import (
    DEFAULT_WORKSPACE_BYTES,
    FlatIndexError,
    TorchFlatIndex,
    UnsupportedGPU,
    check_cuda_devices,
    plan_blocks,
    read_flat_vectors,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def flat_file(tmp_path_factory):
    import faiss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(64)
    index.add(x)
    path = tmp_path_factory.mktemp("flat") / "e5_Flat.index"
    faiss.write_index(index, str(path))
    q = rng.standard_normal((40, 64)).astype(np.float32)
    return path, x, q, index


def test_reads_the_vectors_of_a_faiss_flat_file(flat_file):
    path, x, _, _ = flat_file
    v = read_flat_vectors(path)
    assert v.shape == x.shape and np.array_equal(np.asarray(v), x)


@pytest.mark.parametrize("devices,block_rows", [(["cpu"], 1 << 20), (["cpu", "cpu", "cpu"], 700)])
def test_equals_faiss_exact_search(flat_file, devices, block_rows):
    """Shards (3 here) and blocks (700 rows) merge to FAISS's own top-k: same ids, same scores."""
    path, _, q, index = flat_file
    want_s, want_i = index.search(q, 10)
    got = TorchFlatIndex.load(path, devices=devices, block_rows=block_rows, chunk_rows=999, progress=False)
    assert got.ntotal == 5000
    s, i = got.search(q, 10)
    assert np.array_equal(i, want_i)
    np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)


def test_fp16_shards_keep_the_top_hits(flat_file):
    """The GPU layout (fp16 shards): top-1 identical, scores within fp16 rounding."""
    path, _, q, index = flat_file
    want_s, want_i = index.search(q, 5)
    s, i = TorchFlatIndex.load(path, devices=["cpu", "cpu"], dtype=torch.float16, progress=False).search(q, 5)
    assert np.array_equal(i[:, 0], want_i[:, 0])
    np.testing.assert_allclose(s, want_s, atol=5e-3)


def test_k_beyond_ntotal_pads_like_faiss(tmp_path):
    import faiss

    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32)[:3])
    faiss.write_index(index, str(tmp_path / "small.index"))
    s, i = TorchFlatIndex.load(tmp_path / "small.index", devices=["cpu", "cpu"], progress=False).search(
        np.eye(8, dtype=np.float32)[:1], 5)
    assert i[0, 0] == 0 and sorted(i[0, :3].tolist()) == [0, 1, 2] and i[0, 3:].tolist() == [-1, -1]
    assert s[0, 0] == 1.0 and np.isneginf(s[0, 3:]).all()


def _near_ties(seed=0, nq=24, d=32, per_query=12, filler=400):
    """fp16-exact queries and documents (small integers times powers of two) whose top scores, ~790,
    step by 0.125 where fp16 resolves only 0.5: an fp16 score merges them into ties."""
    rng = np.random.default_rng(seed)
    q = rng.integers(6, 9, (nq, d)) * rng.choice([-1, 1], (nq, d))
    q[:, -1] = 1  # the coordinate that sets each cluster's near-tie order
    docs = []
    for qi in q:
        base = 4 * qi
        base[-1] = 0
        for j in range(per_query):
            v = base.copy()
            v[-1] = j
            docs.append(v)
    docs.extend(rng.integers(-8, 9, (filler, d)))
    x = np.array(docs, dtype=np.float32)[rng.permutation(len(docs))] * 0.5
    return (q * 0.25).astype(np.float32), x.astype(np.float32)


def test_fp16_shards_score_in_fp32_and_order_near_ties_like_faiss():
    """fp16 storage of these vectors is lossless, so fp32 scores are exact: FAISS's ids in FAISS's
    order and its scores to the bit, though neighbours differ by a quarter of fp16's step."""
    import faiss

    q, x = _near_ties()
    assert np.array_equal(x.astype(np.float16).astype(np.float32), x)
    top = -np.sort(-(q @ x.T), axis=1)[:, :11]
    assert (np.diff(top, axis=1) < 0).all() and (top[:, 0] - top[:, 10] < 0.5 * 3).all()  # distinct near-ties
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    want_s, want_i = index.search(q, 10)
    xt = torch.from_numpy(x).half()
    for ws in (DEFAULT_WORKSPACE_BYTES, 20_000):  # one block per shard; many blocks and merges
        got = TorchFlatIndex([xt[:300], xt[300:]], workspace_bytes=ws)
        assert got.modes == ["upcast", "upcast"]  # CPU: no fp32-output fp16 product
        s, i = got.search(q, 10)
        assert s.dtype == np.float32 and np.array_equal(i, want_i) and np.array_equal(s, want_s)


def test_split_query_product_keeps_fp32_query_precision(monkeypatch):
    """The CUDA road (fp32-output fp16 product of the query's hi and lo halves), emulated on CPU with
    the same arithmetic (exact fp16 products, fp32 sums): fp32 queries against fp16 vectors score as
    FAISS does on those vectors to ~1e-7, where rounding the query to fp16 would be off by ~1e-4."""
    import faiss

    import retrieval.flat as flat

    monkeypatch.setattr(flat, "_mm_fp32_out", lambda a, b: a.float() @ b.float())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16).astype(np.float32)
    q = rng.standard_normal((40, 64)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(64)
    index.add(x)
    want_s, want_i = index.search(q, 10)
    xt = torch.from_numpy(x).half()
    got = TorchFlatIndex([xt[:1500], xt[1500:]], workspace_bytes=1 << 16)
    assert got.modes == ["split", "split"]
    s, i = got.search(q, 10)
    assert np.array_equal(i, want_i)
    assert np.abs(s - want_s).max() < 1e-6
    q16 = q.astype(np.float16).astype(np.float32)
    assert np.abs(-np.sort(-(q16 @ x.T), axis=1)[:, :10] - want_s).max() > 1e-5  # what the split avoids
    q[0, 0] = 1e5  # beyond fp16: this search takes the upcast road instead of overflowing
    s, i = got.search(q, 3)
    np.testing.assert_allclose(s[0], -np.sort(-(q[0] @ x.T))[:3], rtol=1e-6)


def test_plan_blocks_keeps_the_product_within_the_workspace():
    mib = 1 << 20
    # the brief's case: 512 queries, 256 MiB -> 131072 rows of fp32 scores, whole batch at once
    assert plan_blocks(512, 10, 2_626_916, 256 * mib) == (512, 131072)
    assert plan_blocks(512, 10, 2_626_916, 256 * mib, bytes_per_score=8) == (512, 65536)
    chunk, rows = plan_blocks(512, 10, 2_626_916, 256 * mib, bytes_per_row=4 * 768)
    assert chunk == 512 and rows % 128 == 0 and rows * (4 * 512 + 4 * 768) <= 256 * mib
    assert plan_blocks(40, 10, 5000, 256 * mib) == (40, 5000)  # a small shard: one block
    assert plan_blocks(40, 10, 5000, 256 * mib, max_rows=700) == (40, 700)
    # k rows of the whole batch do not fit: equal chunks that do
    chunk, rows = plan_blocks(100, 50, 10_000, 4 * 50 * 30)
    assert chunk == 25 and rows == 60 and rows * 4 * chunk <= 4 * 50 * 30
    for batch, k, n, ws, bps, bpr in [(1, 1, 1, 4, 4, 0), (7, 3, 1000, 4096, 8, 0), (3000, 100, 10**6, mib, 4, 3072),
                                      (512, 3, 10**7, 256 * mib, 8, 0), (9, 200, 150, 1000, 4, 0)]:
        chunk, rows = plan_blocks(batch, k, n, ws, bytes_per_score=bps, bytes_per_row=bpr)
        assert 1 <= chunk <= batch and 1 <= rows <= n
        assert rows * (bps * chunk + bpr) <= ws or (chunk == 1 and rows == 1)
    assert plan_blocks(0, 10, 100, mib) == (0, 0) and plan_blocks(5, 10, 0, mib) == (5, 0)


@pytest.mark.parametrize("dtype,emulate_split", [(torch.float32, False), (torch.float16, False), (torch.float16, True)])
def test_search_score_blocks_never_exceed_the_workspace(flat_file, monkeypatch, dtype, emulate_split):
    """Every product's scratch (its fp32 scores, plus the fp32 copy of the block where one is made)
    stays within workspace_bytes, also when the batch has to be split, and the answer is FAISS's."""
    import retrieval.flat as flat

    _, x, q, _ = flat_file
    if emulate_split:
        monkeypatch.setattr(flat, "_mm_fp32_out", lambda a, b: a.float() @ b.float())
    seen = []
    scores = TorchFlatIndex._scores

    def recording(mode, qd, block):
        out = scores(mode, qd, block)
        base = out if out._base is None else out._base  # the split product's (2 * chunk, rows) tensor
        seen.append(base.nbytes + (4 * block.numel() if mode == "upcast" else 0))
        return out

    monkeypatch.setattr(TorchFlatIndex, "_scores", staticmethod(recording))
    import faiss

    stored = torch.from_numpy(x).to(dtype).float().numpy()  # what the shards hold: FAISS over these
    per_query, per_row = (8, 0) if emulate_split else (4, 4 * 64 if dtype == torch.float16 else 0)
    # 64 KiB: the whole batch, blocks of a few hundred rows; then room for just 10 queries x 10 rows
    for ws, n in ((64 << 10, 5000), (10 * (10 * per_query + per_row), 600)):
        seen.clear()
        xt = torch.from_numpy(x[:n]).to(dtype)
        got = TorchFlatIndex([xt[: n // 2], xt[n // 2:]], workspace_bytes=ws)
        chunk, rows = got.plan(0, len(q), 10)
        assert chunk == (40 if ws > 4096 else 10) and rows >= 10
        s, i = got.search(q, 10)
        assert seen and max(seen) <= ws, (got.modes, ws, max(seen))
        exact = faiss.IndexFlatIP(64)
        exact.add(stored[:n])
        want_s, want_i = exact.search(q, 10)
        assert np.array_equal(i, want_i)
        np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-6)


def test_all_blocks_are_launched_before_any_result_is_copied_back(flat_file, monkeypatch):
    """No host sync inside the launch loop: every shard's blocks are queued, in turn across shards,
    before the first copy of a top-k to the host."""
    _, x, q, index = flat_file
    events = []
    scores, cpu = TorchFlatIndex._scores, torch.Tensor.cpu

    def recording(mode, qd, block):
        events.append(("block", block.data_ptr()))
        return scores(mode, qd, block)

    monkeypatch.setattr(TorchFlatIndex, "_scores", staticmethod(recording))
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **kw: (events.append(("cpu",)), cpu(self, *a, **kw))[1])
    xt = torch.from_numpy(x)
    shards = [xt[:1700].clone(), xt[1700:3400].clone(), xt[3400:].clone()]
    got = TorchFlatIndex(shards, block_rows=500)
    s, i = got.search(q, 10)
    kinds = [e[0] for e in events]
    assert kinds.count("block") == 12 and kinds.count("cpu") == 6 and kinds[:12] == ["block"] * 12
    owner = [next(j for j, sh in enumerate(shards) if sh.data_ptr() <= e[1] < sh.data_ptr() + sh.nbytes)
             for e in events[:12]]
    assert owner[:6] == [0, 1, 2, 0, 1, 2]  # round robin: every device busy from the start
    assert np.array_equal(i, index.search(q, 10)[1])


def test_k_beyond_a_shard_and_empty_batches():
    import faiss

    rng = np.random.default_rng(3)
    x = rng.standard_normal((25, 16)).astype(np.float32)
    q = rng.standard_normal((4, 16)).astype(np.float32)
    index = faiss.IndexFlatIP(16)
    index.add(x)
    xt = torch.from_numpy(x)
    got = TorchFlatIndex([xt[:10], xt[10:10], xt[10:]], workspace_bytes=4 * 4 * 3)  # an empty shard; 3-row blocks
    want_s, want_i = index.search(q, 20)  # k = 20 > each shard's rows
    s, i = got.search(q, 20)
    assert np.array_equal(i, want_i)
    np.testing.assert_allclose(s, want_s, rtol=1e-5, atol=1e-5)
    s, i = got.search(q, 30)  # k > ntotal: FAISS's padding
    assert (np.array_equal(i[:, :25], index.search(q, 25)[1]) and (i[:, 25:] == -1).all()
            and np.isneginf(s[:, 25:]).all())
    s, i = got.search(np.zeros((0, 16), np.float32), 5)
    assert s.shape == (0, 5) and i.shape == (0, 5) and s.dtype == np.float32 and i.dtype == np.int64


def test_gpu_workspace_flag_is_validated_and_reaches_the_index(monkeypatch, capsys, tmp_path):
    import retrieval.dense as dense_mod
    import retrieval.flat as flat
    import retrieval.index as index_mod
    from retrieval.server import main

    for bad in ("0", "-3"):
        with pytest.raises(SystemExit) as e:
            main(["--index", "x.index", "--gpu", "--gpu-workspace-mb", bad])
        assert e.value.code == 2 and "--gpu-workspace-mb must be > 0" in capsys.readouterr().err
    seen = {}

    def fake_load(load):
        seen.update(gpu=load.gpu, gpu_workspace_bytes=load.gpu_workspace_bytes)
        raise FileNotFoundError("stop here")

    monkeypatch.setattr(index_mod, "load_configured", fake_load)
    assert main(["--index", "x.index", "--gpu", "--gpu-workspace-mb", "64"]) == 2
    assert capsys.readouterr().err.strip() == "error: stop here"
    assert seen["gpu"] is True and seen["gpu_workspace_bytes"] == 64 << 20
    loads = []
    monkeypatch.setattr(flat.TorchFlatIndex, "load", staticmethod(lambda path, **kw: loads.append(kw)))
    dense_mod.DenseIndex.load(tmp_path / "e5_Flat.index", gpu=True, gpu_workspace_bytes=64 << 20)
    dense_mod.DenseIndex.load(tmp_path / "e5_Flat.index", gpu=True)
    assert loads == [{"workspace_bytes": 64 << 20}, {"workspace_bytes": DEFAULT_WORKSPACE_BYTES}]
    with pytest.raises(ValueError, match="workspace_bytes must be > 0"):
        TorchFlatIndex([torch.zeros((2, 4))], workspace_bytes=0)


def test_non_flat_and_broken_files_are_refused_by_name(tmp_path):
    import faiss

    hnsw = faiss.IndexHNSWFlat(8, 4, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(np.ones((4, 8), dtype=np.float32))
    faiss.write_index(hnsw, str(tmp_path / "h.index"))
    with pytest.raises(FlatIndexError, match=r"h\.index.*not a flat index.*without --gpu"):
        read_flat_vectors(tmp_path / "h.index")
    l2 = faiss.IndexFlatL2(8)
    l2.add(np.ones((4, 8), dtype=np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(FlatIndexError, match="L2 index"):
        read_flat_vectors(tmp_path / "l2.index")
    ip = faiss.IndexFlatIP(8)
    ip.add(np.ones((4, 8), dtype=np.float32))
    faiss.write_index(ip, str(tmp_path / "t.index"))
    data = (tmp_path / "t.index").read_bytes()
    (tmp_path / "t.index").write_bytes(data[:-8])
    with pytest.raises(FlatIndexError, match="truncated"):
        read_flat_vectors(tmp_path / "t.index")
    with pytest.raises(FileNotFoundError):
        read_flat_vectors(tmp_path / "missing.index")


def test_capability_check_names_the_gpu_and_the_fix():
    faiss_gpu_cu12 = ["sm_70", "sm_80"]  # what faiss-gpu-cu12 1.14.1.post1 compiled (no PTX)
    torch_2_11 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    h100 = dict(capability=lambda d: (9, 0), name=lambda d: "NVIDIA H100 80GB HBM3")
    with pytest.raises(UnsupportedGPU, match=r"cuda:0 \(NVIDIA H100 80GB HBM3, .*sm_90\).*sm_70 sm_80.*torch"):
        check_cuda_devices(["cuda:0"], archs=faiss_gpu_cu12, **h100)
    check_cuda_devices(["cuda:0", "cuda:1"], archs=torch_2_11, **h100)
    check_cuda_devices(["cuda:0"], archs=torch_2_11, capability=lambda d: (8, 9), name=lambda d: "L40S")  # sm_86 code
    check_cuda_devices(["cuda:0"], archs=["sm_80", "compute_80"], **h100)  # PTX JIT
    with pytest.raises(UnsupportedGPU, match="sm_70"):
        check_cuda_devices(["cuda:0"], archs=torch_2_11, capability=lambda d: (7, 0), name=lambda d: "V100")


def test_server_with_gpu_and_no_gpu_fails_at_once_with_the_fix(flat_file, small_corpus):
    path, _, _, _ = flat_file
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "retrieval.server", "--index", str(path), "--corpus", str(small_corpus),
                        "--encoder", "minilm", "--gpu", "--port", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "torch sees no CUDA GPU" in r.stderr and "without --gpu" in r.stderr
    assert time.monotonic() - t < 120


def test_wait_stops_as_soon_as_the_server_process_died():
    from tests.conftest import free_port

    dead = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(1)"])
    dead.wait()
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "retrieval.client", f"http://127.0.0.1:{free_port()}", "--wait", "600",
                        "--pid", str(dead.pid)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "exited before answering" in r.stderr, r.stderr
    assert time.monotonic() - t < 30
    r = subprocess.run([sys.executable, "-m", "retrieval.client", "http://127.0.0.1:9", "--pid", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--pid must be a process id" in r.stderr


def test_reproduce_paper_stops_waiting_for_a_dead_retriever(tmp_path):
    """reproduce_paper.sh starts the e5 retriever itself; one that dies (here: no index) ends the wait at
    once with the end of its log, instead of 30 minutes of polling."""
    wiki, data = tmp_path / "wiki18", tmp_path / "data"
    wiki.mkdir()
    data.mkdir()
    for f in ("e5_Flat.index", "wiki-18.jsonl"):
        (wiki / f).write_text("")  # present, so no download; unusable, so the server exits
    for f in ("train.parquet", "test.parquet", "val_sample.parquet"):
        (data / f).write_text("")
    from tests.conftest import free_port

    env = {**os.environ, "PYTHON": sys.executable, "MODEL": "Qwen/Qwen2.5-3B-Instruct", "PRESET": "grpo_llds",
           "WIKI18": str(wiki), "DATA_DIR": str(data), "RETRIEVER_URL": f"http://127.0.0.1:{free_port()}/retrieve"}
    t = time.monotonic()
    r = subprocess.run(["bash", "scripts/reproduce_paper.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "exited before answering" in r.stderr and "the retriever did not come up" in r.stderr
    assert "error:" in r.stderr.split("the end of runs/retriever.log:")[-1]  # the server's own message
    assert time.monotonic() - t < 240
