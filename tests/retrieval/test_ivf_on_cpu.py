"""IVF indexes: built with their recall against exact search, served on CPU, and sent to the GPUs through
faiss-gpu (retrieval/gpu_ivf.py). On CPU, faiss's GPU API is stood in for by attributes patched onto the
real faiss module: the choices (which road, which cloner options, nprobe, the errors) are what is tested;
the real GPU run is the test marked gpu."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval import gpu_ivf
from retrieval.flat import FlatIndexError, UnsupportedGPU
from retrieval.index import DenseIndex, load_retriever
from retrieval.recall import exact_topk, recall_vs_exact

ROOT = Path(__file__).resolve().parents[2]


def vectors(n=2000, d=64, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def saved(tmp_path, factory, x, nprobe=4, name="ivf.index"):
    index = DenseIndex.build(factory, x, nprobe=nprobe)
    index.save(tmp_path / name)
    return tmp_path / name, index


class FakeResources:
    def __init__(self):
        self.temp = None

    def setTempMemory(self, n):
        self.temp = n


class FakeClonerOptions:  # faiss.GpuMultipleClonerOptions's defaults
    def __init__(self):
        self.shard = self.common_ivf_quantizer = self.useFloat16 = False


@pytest.fixture
def fake_gpus(monkeypatch):
    """faiss with a GPU API that "clones" to CPU; ``calls`` records each clone, ``set_gpus(n)`` the count."""
    import faiss

    class Calls(list):
        def set_gpus(self, n):
            count["n"] = n

    calls, count = Calls(), {"n": 2}

    def clone(resources, index, co, gpus):
        calls.append({"resources": resources, "co": co, "gpus": gpus})
        return faiss.clone_index(index)

    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", FakeClonerOptions, raising=False)
    monkeypatch.setattr(faiss, "GpuParameterSpace", faiss.ParameterSpace, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: count["n"])
    monkeypatch.setattr(faiss, "index_cpu_to_gpu_multiple_py", clone)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index, co=None, ngpu=-1: index)  # build's k-means
    return calls


def test_ivf_goes_to_every_gpu_sharded_with_its_nprobe(tmp_path, fake_gpus, capsys):
    import faiss

    x = vectors()
    path, cpu = saved(tmp_path, "IVF16,PQ8", x)
    assert "k-means on 2 GPU(s)" in capsys.readouterr().out  # the build trained its quantizer on the GPUs
    gpu = DenseIndex.load(path, gpu=True, gpu_workspace_bytes=64 << 20)
    (call,) = fake_gpus
    assert call["gpus"] == [0, 1] and [r.temp for r in call["resources"]] == [64 << 20] * 2
    assert call["co"].shard and call["co"].common_ivf_quantizer and not call["co"].useFloat16  # PQ8: fp32 tables
    assert gpu.gpu_resources is call["resources"] and gpu.nprobe == cpu.nprobe == 4
    np.testing.assert_array_equal(gpu.search(x[:20], 5)[1], cpu.search(x[:20], 5)[1])

    fake_gpus.set_gpus(1)
    DenseIndex.load(path, gpu=True)
    assert not fake_gpus[-1]["co"].shard and fake_gpus[-1]["resources"][0].temp == 256 << 20  # the default
    pq64 = faiss.index_factory(128, "IVF4,PQ64", faiss.METRIC_INNER_PRODUCT)  # wiki-18's code size
    co = gpu_ivf.cloner_options(faiss, faiss.try_extract_index_ivf(pq64), 8)
    assert co.useFloat16 and co.shard  # 64 x 256 x 4 B of fp32 lookup table > 48 KiB: fp16 tables


def test_gpu_ivf_fails_at_load_naming_what_is_installed_and_the_fix(tmp_path, fake_gpus, monkeypatch):
    import faiss

    path, _ = saved(tmp_path, "IVF16,PQ8", vectors())
    fake_gpus.set_gpus(0)  # faiss-gpu imported on a machine without a GPU it can see
    with pytest.raises(UnsupportedGPU, match="faiss-gpu .*sees no GPU.*without --gpu"):
        DenseIndex.load(path, gpu=True)
    assert fake_gpus == []  # failed before any clone (faiss would return an empty index)
    monkeypatch.delattr(faiss, "StandardGpuResources")  # a CPU build: faiss-cpu
    with pytest.raises(gpu_ivf.FaissGPUUnavailable, match=r"needs faiss-gpu.*faiss-cpu 1\.\d+.*install -e '\.\[gpu\]'"):
        DenseIndex.load(path, gpu=True)


def test_flat_keeps_the_torch_road_and_other_kinds_are_refused(tmp_path, fake_gpus, monkeypatch):
    import retrieval.flat as flat

    loads = []
    monkeypatch.setattr(flat.TorchFlatIndex, "load", staticmethod(lambda path, **kw: loads.append(path)))
    flat_path, _ = saved(tmp_path, "Flat", vectors(n=50), name="flat.index")
    DenseIndex.load(flat_path, gpu=True)
    assert loads == [flat_path] and fake_gpus == []  # exact search stays in torch, faiss-gpu or not
    hnsw, _ = saved(tmp_path, "HNSW8", vectors(n=50), name="hnsw.index")
    with pytest.raises(FlatIndexError, match=r"hnsw\.index is a FAISS HNSW index.*on CPU without --gpu"):
        DenseIndex.load(hnsw, gpu=True)
    pq4, _ = saved(tmp_path, "IVF4,PQ8x4", vectors(), name="pq4.index")
    with pytest.raises(gpu_ivf.FaissGPUUnavailable, match=r"8-bit codes.*PQ8x4.*IVF65536,PQ64"):
        DenseIndex.load(pq4, gpu=True)
    assert fake_gpus == []


def test_exact_topk_in_chunks_and_recall():
    import faiss

    x = vectors(n=1000, d=32)
    flat = faiss.IndexFlatIP(32)
    flat.add(x)
    s, i = exact_topk(x, x[:50], 7, chunk_rows=130)  # 8 chunks merged
    ref_s, ref_i = flat.search(x[:50], 7)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(s, ref_s, rtol=1e-6)
    assert recall_vs_exact(DenseIndex(flat), x, sample=100, chunk_rows=300) == {"sample": 100, "at_1": 1.0,
                                                                                 "at_10": 1.0}


@pytest.fixture(scope="module")
def ivf_dir(dense_index_dir, tmp_path_factory):
    """The small corpus's MiniLM vectors (the dense fixture's: nothing is encoded again) built as IVF16,PQ8
    by the command; returns the folder and what the command printed."""
    from retrieval.build import main

    out = tmp_path_factory.mktemp("ivf") / "idx"
    shutil.copytree(dense_index_dir, out, ignore=shutil.ignore_patterns("index.faiss", "manifest.json"))
    corpus = json.loads((dense_index_dir / "manifest.json").read_text())["corpus"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["--corpus", corpus, "--out", str(out), "--factory", "IVF16,PQ8", "--recall-sample", "200"])
    return out, printed.getvalue()


def test_build_prints_and_stores_recall_and_the_index_serves(ivf_dir, dense_index_dir):
    out, printed = ivf_dir
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encode_seconds"] < 1  # the copied vectors were trusted: only the index was built
    line = next(line for line in printed.splitlines() if line.startswith("recall@1/@10 vs exact: "))
    recall = manifest["recall"]
    assert recall["sample"] == 200 and recall["nprobe"] == 32
    assert 0 < recall["at_1"] <= 1 and 0 < recall["at_10"] <= 1
    assert f"{recall['at_1']:.3f} / {recall['at_10']:.3f}" in line
    ivf, exact = load_retriever(out), load_retriever(dense_index_dir)
    assert type(ivf.index.index).__name__ == "IndexIVFPQ" and ivf.index.ntotal == 300
    queries = [ivf.corpus.get(i)["contents"].split("\n", 1)[1][:200] for i in range(0, 300, 30)]
    got, ref = ivf.search(queries, 3), exact.search(queries, 3)
    assert all(len(r) == 3 for r in got)
    same_top1 = sum(g[0][0]["id"] == e[0][0]["id"] for g, e in zip(got, ref))
    assert same_top1 >= 8, same_top1  # of 10


def test_server_refuses_gpu_ivf_without_faiss_gpu(ivf_dir):
    import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("faiss-gpu with a GPU: the server would serve it")
    out, _ = ivf_dir
    r = subprocess.run([sys.executable, "-m", "retrieval.server", "--index", str(out), "--gpu", "--port", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: " in r.stderr and ("needs faiss-gpu" in r.stderr or "sees no GPU" in r.stderr)
    assert "Traceback" not in r.stderr


@pytest.mark.gpu
def test_ivf_on_real_gpus_matches_cpu(tmp_path):
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        pytest.skip("faiss-cpu installed: the GPU extra's faiss-gpu is needed")
    x = vectors(n=20000, d=128)
    for factory in ("IVF64,Flat", "IVF64,PQ64"):
        path, cpu = saved(tmp_path, factory, x, nprobe=8, name=f"{factory.replace(',', '_')}.index")
        gpu = DenseIndex.load(path, gpu=True)
        assert gpu.ntotal == cpu.ntotal
        got, ref = gpu.search(x[:100], 10)[1], cpu.search(x[:100], 10)[1]
        overlap = np.mean([len(set(g) & set(r)) / 10 for g, r in zip(got, ref)])
        assert overlap > (0.99 if "Flat" in factory else 0.8), (factory, overlap)
