"""Which road a dense index takes to the GPUs, and the faiss-gpu road for IVF indexes.

``DenseIndex.load(path, gpu=True)`` reads the file's FAISS type tag (its first four bytes) first:

- a **flat** index (``IxFI``): exact search in torch, fp16 shards over every GPU (:mod:`retrieval.flat`);
  no FAISS kernel, any GPU the installed torch runs on;
- an **IVF** index (IVF-Flat, IVF-SQ, IVF-PQ; tags ``Iv..``/``Iw..``, or wrapped in an ID map or a
  pre-transform): read by FAISS on CPU and cloned onto every visible GPU by faiss-gpu
  (:func:`to_gpus`), its inverted lists sharded over the GPUs, each GPU probing them with its own fp32
  copy of the coarse quantizer (the lists one GPU, or the CPU, probes: see :func:`cloner_options`);
- anything else (HNSW, ...): refused by name; it is served on CPU, without ``--gpu``.

faiss-gpu is the ``gpu`` extra's FAISS (``faiss-gpu==1.15.1``: SASS for sm_70-sm_90, compute_90 PTX).
Without it (faiss-cpu installed) or without a GPU it can see, the load fails at once with what is
installed and what to do, not later in a search (faiss's ``index_cpu_to_all_gpus`` with no GPU returns
an empty index whose search raises a bare AssertionError).

An IVF build (:meth:`retrieval.dense.DenseIndex.build`) uses the GPUs where faiss-gpu sees some: the
coarse quantizer's k-means (:func:`clustering_index`) and the coarse assignment of every vector added
(:func:`add_on_gpus`); without them both run on CPU, to the same index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from retrieval.flat import FlatIndexError, UnsupportedGPU

FLAT_TAGS = (b"IxFI", b"IxF2")
WRAPPER_TAGS = (b"IxPT", b"IxMp", b"IxM2")  # pre-transform, ID maps: may hold an IVF index
#: faiss-gpu's IVF-PQ: 8-bit codes, and code sizes its kernels are compiled for (faiss/gpu/impl/IVFPQ.cu)
GPU_PQ_BYTES = (1, 2, 3, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64, 96)
#: above 48 bytes the fp32 lookup table (M x 256 x 4 B) exceeds 48 KiB of shared memory: fp16 tables
FP32_TABLE_MAX_BYTES = 48
GPU_MAX_NPROBE = 2048  # faiss-gpu's largest k-selection


class FaissGPUUnavailable(UnsupportedGPU):
    """An IVF index asked for on GPUs where faiss cannot put it there (the message says what to install)."""


def type_tag(path: str | os.PathLike) -> Optional[bytes]:
    """The FAISS type tag of an index file (``b"IxFI"``, ``b"IwPQ"``, ...), or None for a missing file."""
    try:
        with open(path, "rb") as f:
            return f.read(4)
    except (FileNotFoundError, IsADirectoryError):
        return None


def road(path: str | os.PathLike) -> str:
    """``"torch"`` (flat, or a missing file: the torch loader names it) or ``"faiss"`` (maybe IVF);
    other index types raise :class:`FlatIndexError` naming the type."""
    tag = type_tag(path)
    if tag is None or tag in FLAT_TAGS:
        return "torch"
    if tag[:2] in (b"Iv", b"Iw") or tag in WRAPPER_TAGS:
        return "faiss"
    kind = "HNSW" if tag.startswith(b"IHN") else f"type {tag.decode('latin-1')!r}"
    raise FlatIndexError(f"{path} is a FAISS {kind} index: --gpu serves flat indexes (exact, in torch) and IVF "
                         f"indexes (faiss-gpu); serve this one on CPU without --gpu")


def installed_faiss() -> str:
    """The FAISS distributions installed, e.g. ``faiss-cpu 1.15.1`` (for error messages)."""
    import importlib.metadata as md

    found = sorted(f"{d.metadata['Name']} {d.version}" for d in md.distributions()
                   if (d.metadata["Name"] or "").lower().replace("_", "-").startswith("faiss"))
    return ", ".join(found) or "no FAISS distribution"


def gpu_count(faiss) -> int:
    """How many GPUs faiss can use; raises :class:`FaissGPUUnavailable` when none."""
    if not hasattr(faiss, "StandardGpuResources"):
        raise FaissGPUUnavailable(
            f"serving an IVF index on GPUs needs faiss-gpu, but the installed FAISS is a CPU build "
            f"({installed_faiss()}). Install the GPU extra's FAISS in its place: pip uninstall -y faiss-cpu && "
            f"pip install -e '.[gpu]' (faiss-gpu 1.15.1; never both: they share the faiss/ package), or serve "
            f"on CPU without --gpu")
    n = int(faiss.get_num_gpus())
    if n < 1:
        raise FaissGPUUnavailable(
            f"faiss-gpu ({installed_faiss()}) sees no GPU: no NVIDIA driver, CUDA_VISIBLE_DEVICES empty, or "
            f"its CUDA 12 runtime wheels (nvidia-cuda-runtime-cu12, nvidia-cublas-cu12) missing; serve on CPU "
            f"without --gpu")
    return n


def cloner_options(faiss, ivf, ngpu: int):
    """faiss-gpu's cloner options for ``ivf`` (the IVF part of the index) on ``ngpu`` GPUs.

    On 2+ GPUs each GPU holds 1/ngpu of the inverted lists (``shard``) in a GpuIndexIVF* of its own, whose
    coarse quantizer faiss clones in fp32 whatever the options (``GpuIndexIVF::copyFrom`` clones it with
    default ``GpuClonerOptions``), as on one GPU: every GPU count probes the lists the CPU index probes.
    ``common_ivf_quantizer`` stays off: with it faiss clones one more coarse quantizer for all the shards
    with the shards' own options (``ToGpuClonerMultiple::clone_Index_to_shards``), so ``useFloat16``,
    meant for IVF-PQ's lookup tables, would make it an fp16 GpuIndexFlat: other lists probed and other
    coarse scores in the results than the recall the build measured (and one more copy of the centroids
    on every GPU)."""
    co = faiss.GpuMultipleClonerOptions()
    co.shard = ngpu > 1  # each GPU holds 1/ngpu of the inverted lists and its own fp32 coarse quantizer
    co.common_ivf_quantizer = False  # not one shared quantizer: it would take useFloat16 (fp16 centroids)
    pq = getattr(faiss.downcast_index(ivf), "pq", None)
    if pq is not None:
        if pq.nbits != 8 or pq.M not in GPU_PQ_BYTES:
            raise FaissGPUUnavailable(
                f"faiss-gpu's IVF-PQ needs 8-bit codes of {'/'.join(map(str, GPU_PQ_BYTES))} bytes; this index "
                f"has PQ{pq.M}x{pq.nbits}. Rebuild it (e.g. --factory IVF65536,PQ64) or serve on CPU without --gpu")
        co.useFloat16 = pq.M > FP32_TABLE_MAX_BYTES  # fp16 lookup tables: PQ56/64/96 need them
    return co


def to_gpus(index, faiss, workspace_bytes: Optional[int] = None):
    """``(gpu index, resources)``: the CPU IVF ``index`` on every GPU faiss sees, nprobe kept.
    ``workspace_bytes``: faiss's temporary memory per GPU (its own default: 1.5 GiB)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        raise FlatIndexError(f"a FAISS {type(faiss.downcast_index(index)).__name__} holds no IVF index: --gpu "
                             f"serves flat and IVF indexes; serve this one on CPU without --gpu")
    n = gpu_count(faiss)
    nprobe = int(ivf.nprobe)
    if nprobe > GPU_MAX_NPROBE:
        raise FaissGPUUnavailable(f"nprobe {nprobe} is above faiss-gpu's limit of {GPU_MAX_NPROBE} lists per query; "
                                  f"rebuild with a smaller --nprobe or serve on CPU without --gpu")
    co = cloner_options(faiss, ivf, n)
    resources = [faiss.StandardGpuResources() for _ in range(n)]
    if workspace_bytes:
        for res in resources:
            res.setTempMemory(int(workspace_bytes))
    try:
        gpu = faiss.index_cpu_to_gpu_multiple_py(resources, index, co, list(range(n)))
    except RuntimeError as e:  # faiss's C++ errors (an index type without a GPU version, out of memory)
        raise FaissGPUUnavailable(f"faiss-gpu could not put the {type(faiss.downcast_index(ivf)).__name__} "
                                  f"index on {n} GPU(s): {(str(e).strip().splitlines() or [repr(e)])[-1]}") from e
    faiss.GpuParameterSpace().set_index_parameter(gpu, "nprobe", nprobe)
    if int(gpu.ntotal) != int(index.ntotal):
        raise FaissGPUUnavailable(f"faiss-gpu holds {gpu.ntotal} of the index's {index.ntotal} vectors on {n} GPU(s)")
    return gpu, resources


def clustering_index(faiss, ivf):
    """For an IVF build: a flat index on every GPU faiss sees, for the k-means of the coarse quantizer
    (65,536 centroids over millions of vectors: hours on CPU, minutes on a GPU), or None without one."""
    if not hasattr(faiss, "StandardGpuResources") or int(faiss.get_num_gpus()) < 1:
        return None
    print(f"training the {ivf.nlist}-list coarse quantizer's k-means on {faiss.get_num_gpus()} GPU(s)", flush=True)
    return faiss.index_cpu_to_all_gpus(faiss.IndexFlat(ivf.d, ivf.quantizer.metric_type))


#: IVF types whose add is IndexIVF::add_with_ids (the quantizer's assign, then add_core): they take their
#: lists precomputed. Not IndexIVFFastScan (``..x4fs``) nor IndexIVFFlatDedup, which assign in their own add.
PREASSIGNED_ADD = ("IndexIVFFlat", "IndexIVFScalarQuantizer", "IndexIVFPQ")
ADD_BATCH = 65536


def add_on_gpus(faiss, index, vectors, batch: int = ADD_BATCH) -> Optional[int]:
    """Add ``vectors`` to the trained IVF ``index`` (on CPU) with their coarse assignment, the nearest of the
    nlist centroids, computed on every GPU faiss sees (wiki-18 into IVF65536: 21M x 65,536 x 768 x 2 =
    2.1 PFLOP, the bulk of the add; *arithmetic*). Returns how many were added, or None, adding nothing,
    without faiss-gpu or a GPU, or for an index this does not cover (a wrapper such as a pre-transform or
    an ID map, a fast-scan IVF, a non-flat coarse quantizer): the caller then adds on CPU.

    The rest is faiss's own CPU add (``IndexIVF::add_core``, what ``add`` runs after the quantizer's
    assign): the same ids (ntotal + i), residuals and codes computed on CPU against the CPU quantizer,
    which stays in place. So the index is the CPU path's as long as the GPU picks the same nearest
    centroid: it searches an fp32 copy of the centroids (faiss's default cloner options, no fp16), but
    its GEMM sums in another order than the CPU's, so a vector whose two best centroids score within
    float32 rounding (about 1e-6 of the score) may go to the other one; the CPU path alone already
    varies that way with the batch size (SIMD loop below 128,000 floats a batch, BLAS above) and BLAS."""
    if not hasattr(faiss, "StandardGpuResources") or int(faiss.get_num_gpus()) < 1:
        return None
    ivf = faiss.downcast_index(index)
    if type(ivf).__name__ not in PREASSIGNED_ADD or not ivf.is_trained:
        return None
    if not type(faiss.downcast_index(ivf.quantizer)).__name__.startswith("IndexFlat"):
        return None  # an HNSW quantizer's assignment is approximate: a GPU flat search would change it
    print(f"assigning {len(vectors)} vectors to the {ivf.nlist} lists on {faiss.get_num_gpus()} GPU(s)", flush=True)
    centroids = faiss.index_cpu_to_all_gpus(ivf.quantizer)  # fp32 GpuIndexFlat replicas: queries split over GPUs
    for i in range(0, len(vectors), batch):
        x = np.ascontiguousarray(vectors[i: i + batch], dtype=np.float32)
        lists = np.ascontiguousarray(centroids.search(x, 1)[1][:, 0], dtype=np.int64)
        ivf.add_core(len(x), faiss.swig_ptr(x), None, faiss.swig_ptr(lists))  # faiss.contrib.ivf_tools.add_preassigned
    return len(vectors)


def load_to_gpus(path: str | os.PathLike, faiss, workspace_bytes: Optional[int] = None):
    """Read an IVF index file on CPU and clone it onto every GPU (see :func:`to_gpus`)."""
    gpu_count(faiss)  # before reading a large file
    if not Path(path).is_file():
        raise FileNotFoundError(f"FAISS index not found: {path}")
    return to_gpus(faiss.read_index(str(path)), faiss, workspace_bytes)
