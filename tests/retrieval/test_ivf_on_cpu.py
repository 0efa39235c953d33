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
from retrieval.dense import DenseIndex
from retrieval.flat import FlatIndexError, UnsupportedGPU
from retrieval.index import load_retriever
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


def searched_coarse_quantizer(co, ngpu):
    """``(precision, centroid copies per GPU)`` of the coarse quantizer faiss-gpu 1.15 searches for an IVF
    index cloned with ``co`` (faiss/gpu/GpuCloner.cpp, GpuIndexIVF.cu): each GpuIndexIVF* holds its own,
    cloned in fp32 by GpuIndexIVF::copyFrom (default GpuClonerOptions); on 2+ GPUs with ``shard`` and
    ``common_ivf_quantizer``, faiss clones one more for all the shards (an IndexShardsIVF's, searched instead)
    with the options' ``useFloat16``: a GpuIndexFlat in fp16 when it is set."""
    if ngpu > 1 and co.shard and co.common_ivf_quantizer:
        return ("fp16" if co.useFloat16 else "fp32"), 2
    return "fp32", 1


def counted_flat(index):
    """What the stand-in ``index_cpu_to_all_gpus`` returns: a real IndexFlat, ``index``'s copy (faiss's
    k-means takes it), that counts in ``rows`` the rows searched from Python."""
    import faiss

    class CountedFlat(faiss.IndexFlat):  # a class per copy: faiss refuses new attributes on an instance
        rows = []

        def search(self, x, k, *args, **kwargs):
            self.rows.append(len(x))
            return super().search(x, k, *args, **kwargs)

    flat = CountedFlat(index.d, index.metric_type)
    if index.ntotal:
        flat.add(index.reconstruct_n(0, index.ntotal))
    return flat


@pytest.fixture
def fake_gpus(monkeypatch):
    """faiss with a GPU API that "clones" to CPU; ``calls`` records each clone, ``set_gpus(n)`` the count,
    ``flats`` the indexes ``index_cpu_to_all_gpus`` made (the build's k-means and coarse assignment). A clone
    searches as faiss-gpu would: with fp16 centroids where faiss's coarse quantizer is fp16."""
    import faiss

    class Calls(list):
        flats = []

        def set_gpus(self, n):
            count["n"] = n

    calls, count = Calls(), {"n": 2}

    def clone(resources, index, co, gpus):
        calls.append({"resources": resources, "co": co, "gpus": gpus})
        out = faiss.clone_index(index)
        if searched_coarse_quantizer(co, len(gpus))[0] == "fp16":
            q = faiss.extract_index_ivf(out).quantizer
            centroids = q.reconstruct_n(0, q.ntotal)
            q.reset()
            q.add(centroids.astype(np.float16).astype(np.float32))
        return out

    def all_gpus(index, co=None, ngpu=-1):
        calls.flats.append(counted_flat(index))
        return calls.flats[-1]

    monkeypatch.setattr(faiss, "StandardGpuResources", FakeResources, raising=False)
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", FakeClonerOptions, raising=False)
    monkeypatch.setattr(faiss, "GpuParameterSpace", faiss.ParameterSpace, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: count["n"])
    monkeypatch.setattr(faiss, "index_cpu_to_gpu_multiple_py", clone)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", all_gpus)
    return calls


def test_ivf_goes_to_every_gpu_sharded_with_its_nprobe(tmp_path, fake_gpus, capsys):
    import faiss

    x = vectors()
    path, cpu = saved(tmp_path, "IVF16,PQ8", x)
    assert "k-means on 2 GPU(s)" in capsys.readouterr().out  # the build trained its quantizer on the GPUs
    gpu = DenseIndex.load(path, gpu=True, gpu_workspace_bytes=64 << 20)
    (call,) = fake_gpus
    assert call["gpus"] == [0, 1] and [r.temp for r in call["resources"]] == [64 << 20] * 2
    assert call["co"].shard and not call["co"].useFloat16  # PQ8: fp32 tables
    assert searched_coarse_quantizer(call["co"], 2) == ("fp32", 1)  # each GPU probes with its own fp32 copy
    assert gpu.gpu_resources is call["resources"] and gpu.nprobe == cpu.nprobe == 4
    np.testing.assert_array_equal(gpu.search(x[:20], 5)[1], cpu.search(x[:20], 5)[1])

    fake_gpus.set_gpus(1)
    DenseIndex.load(path, gpu=True)
    assert not fake_gpus[-1]["co"].shard and fake_gpus[-1]["resources"][0].temp == 256 << 20  # the default
    pq64 = faiss.index_factory(128, "IVF4,PQ64", faiss.METRIC_INNER_PRODUCT)  # wiki-18's code size
    co = gpu_ivf.cloner_options(faiss, faiss.try_extract_index_ivf(pq64), 8)
    assert co.useFloat16 and co.shard  # 64 x 256 x 4 B of fp32 lookup table > 48 KiB: fp16 tables


def test_coarse_quantizer_stays_fp32_on_every_gpu_count_with_fp16_pq_tables(fake_gpus):
    import faiss

    for factory, fp16_tables in (("IVF4,PQ64", True), ("IVF4,PQ8", False), ("IVF4,Flat", False)):
        index = faiss.index_factory(128, factory, faiss.METRIC_INNER_PRODUCT)  # held: ivf points into it
        ivf = faiss.try_extract_index_ivf(index)
        for ngpu in (1, 2, 8):
            co = gpu_ivf.cloner_options(faiss, ivf, ngpu)
            assert co.shard == (ngpu > 1) and co.useFloat16 == fp16_tables, (factory, ngpu)
            # the probed lists and coarse scores are the CPU's, and the centroids are on each GPU once
            assert searched_coarse_quantizer(co, ngpu) == ("fp32", 1), (factory, ngpu)


def test_ivfpq64_on_two_gpus_serves_what_the_cpu_index_does(tmp_path, fake_gpus):
    x = vectors(n=3000, d=128)
    path, cpu = saved(tmp_path, "IVF16,PQ64", x, nprobe=4)  # wiki-18's code size: fp16 lookup tables
    gpu = DenseIndex.load(path, gpu=True)
    assert fake_gpus[-1]["co"].useFloat16 and fake_gpus[-1]["gpus"] == [0, 1]
    (got_s, got_i), (ref_s, ref_i) = gpu.search(x[:200], 10), cpu.search(x[:200], 10)
    np.testing.assert_array_equal(got_i, ref_i)  # fp16 centroids would probe other lists ...
    np.testing.assert_array_equal(got_s, ref_s)  # ... and shift every IP score by the coarse term


def trained(factory, x):
    import faiss

    index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    return index


@pytest.mark.parametrize("factory", ["IVF16,Flat", "IVF16,SQ8", "IVF16,PQ8"])
def test_ivf_add_assigns_on_the_gpus_to_the_same_index(factory, fake_gpus, capsys):
    import faiss

    x = vectors()
    on_cpu, on_gpus = trained(factory, x), trained(factory, x)
    for i in range(0, len(x), 700):
        on_cpu.add(x[i: i + 700])
    assert gpu_ivf.add_on_gpus(faiss, on_gpus, x, batch=700) == len(x)
    (flat,) = fake_gpus.flats
    assert flat.ntotal == 16 and flat.rows == [700, 700, 600]  # the centroids, searched for every vector
    assert "assigning 2000 vectors to the 16 lists on 2 GPU(s)" in capsys.readouterr().out
    assert on_gpus.ntotal == len(x)
    assert bytes(faiss.serialize_index(on_gpus)) == bytes(faiss.serialize_index(on_cpu))  # lists, ids, codes


def test_ivf_add_leaves_the_cpu_path_without_a_gpu_or_for_other_indexes(fake_gpus, monkeypatch):
    import faiss

    x = vectors()
    for factory in ("IVF16,PQ8x4fs", "PCA32,IVF16,Flat", "IVF16_HNSW8,Flat", "Flat"):  # fast-scan, wrapped, ...
        index = trained(factory, x)
        assert gpu_ivf.add_on_gpus(faiss, index, x) is None and index.ntotal == 0, factory
    index = trained("IVF16,Flat", x)
    fake_gpus.set_gpus(0)
    assert gpu_ivf.add_on_gpus(faiss, index, x) is None
    monkeypatch.delattr(faiss, "StandardGpuResources")  # faiss-cpu
    assert gpu_ivf.add_on_gpus(faiss, index, x) is None
    assert index.ntotal == 0 and fake_gpus.flats == []


def test_build_adds_with_the_gpus_assignment_to_the_cpu_builds_index(fake_gpus, capsys):
    import faiss

    x = vectors(n=3000)
    fake_gpus.set_gpus(0)
    cpu = DenseIndex.build("IVF16,PQ8", x, nprobe=4)
    fake_gpus.set_gpus(2)
    gpu = DenseIndex.build("IVF16,PQ8", x, nprobe=4)
    assert len(fake_gpus.flats) == 2, "the build's add did not assign on the GPUs (gpu_ivf.add_on_gpus)"
    kmeans, assign = fake_gpus.flats  # the k-means' flat index, then the trained centroids'
    assert assign.ntotal == 16 and sum(assign.rows) == len(x)
    assert "assigning 3000 vectors to the 16 lists on 2 GPU(s)" in capsys.readouterr().out
    assert bytes(faiss.serialize_index(gpu.index)) == bytes(faiss.serialize_index(cpu.index))


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
