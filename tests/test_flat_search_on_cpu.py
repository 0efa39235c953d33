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

from retrieval.flat import FlatIndexError, TorchFlatIndex, UnsupportedGPU, check_cuda_devices, read_flat_vectors

ROOT = Path(__file__).resolve().parent.parent


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
