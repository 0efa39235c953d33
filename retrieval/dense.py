"""The dense index kind: FAISS over encoder vectors, inner product.

Any FAISS factory string builds one (``Flat``, ``HNSW64``, ``IVF4096,PQ64`` ...): the kind is one, the
factory picks the structure, and its manifest records both. On CPU any of them is searched by FAISS
(memory-mapped loading of on-disk flat indexes with ``--mmap``). With ``--gpu``, :mod:`retrieval.gpu_ivf`
picks the road: flat indexes are searched exactly in torch, sharded over all GPUs (:mod:`retrieval.flat`),
IVF indexes by faiss-gpu on all GPUs, anything else is refused by name. Its builder is
:mod:`retrieval.dense_build`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np


def import_faiss():
    """faiss, or an error that says which extra installs it (exactly one faiss build per install)."""
    try:
        import faiss
    except ImportError as e:
        raise ImportError(f"dense retrieval needs FAISS, which is not importable ({e}). Install one of the two "
                          "extras that bring it: pip install -e '.[cpu]' (faiss-cpu) on a CPU machine, or "
                          "pip install -e '.[gpu]' (faiss-gpu 1.15.1) on a GPU machine. Never both, nor a third "
                          "FAISS build (faiss-gpu-cu12, conda's faiss): they all write the faiss/ package.") from e
    return faiss


class DenseIndex:
    def __init__(self, index, gpu_resources=None):
        self.index = index
        self.gpu_resources = gpu_resources  # faiss-gpu's per-GPU resources, kept as long as the index

    @staticmethod
    def build(factory: str, vectors: np.ndarray, *, train_size: int = 262144, seed: int = 0,
              hnsw_ef_search: int = 128, nprobe: int = 32) -> "DenseIndex":
        faiss = import_faiss()

        dim = vectors.shape[1]
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            from retrieval.gpu_ivf import clustering_index

            rng = np.random.default_rng(seed)
            n = min(train_size, len(vectors))
            sample = vectors[np.sort(rng.choice(len(vectors), n, replace=False))] if n < len(vectors) else vectors
            ivf = faiss.try_extract_index_ivf(index)
            if ivf is not None and hasattr(faiss.downcast_index(ivf), "do_polysemous_training"):
                faiss.downcast_index(ivf).do_polysemous_training = False  # IVF-PQ: for Hamming filters, unused here
            on_gpus = clustering_index(faiss, ivf) if ivf is not None else None  # held while training
            if on_gpus is not None:
                ivf.clustering_index = on_gpus
            index.train(np.ascontiguousarray(sample, dtype=np.float32))
            if on_gpus is not None:
                ivf.clustering_index = None
        from retrieval.gpu_ivf import add_on_gpus

        if add_on_gpus(faiss, index, vectors) is None:  # no GPU, or not a plain IVF: the coarse assignment on CPU
            for i in range(0, len(vectors), 65536):
                index.add(np.ascontiguousarray(vectors[i: i + 65536], dtype=np.float32))
        out = DenseIndex(index)
        out.tune(hnsw_ef_search=hnsw_ef_search, nprobe=nprobe)
        return out

    def tune(self, hnsw_ef_search: Optional[int] = None, nprobe: Optional[int] = None) -> None:
        faiss = import_faiss()

        params = []
        if hnsw_ef_search and "HNSW" in type(faiss.downcast_index(self.index)).__name__:
            params.append(f"efSearch={hnsw_ef_search}")
        if nprobe and ("IVF" in type(faiss.downcast_index(self.index)).__name__
                       or faiss.try_extract_index_ivf(self.index) is not None):  # also under a PCA or an ID map
            params.append(f"nprobe={nprobe}")
        if params:
            space = faiss.GpuParameterSpace() if self.gpu_resources else faiss.ParameterSpace()
            space.set_index_parameters(self.index, ",".join(params))

    def save(self, path: str | os.PathLike) -> None:
        faiss = import_faiss()

        faiss.write_index(self.index, str(path))

    @staticmethod
    def load(path: str | os.PathLike, *, mmap: bool = False, gpu: bool = False,
             gpu_workspace_bytes: Optional[int] = None):
        """A FAISS index on CPU; with ``gpu``, on every visible GPU (:mod:`retrieval.gpu_ivf` picks the
        road): a flat index searched exactly in torch (:class:`retrieval.flat.TorchFlatIndex`, fp16
        shards), an IVF index by faiss-gpu (inverted lists sharded over the GPUs), anything else refused.
        ``gpu_workspace_bytes``: search scratch per GPU (default: 256 MiB; faiss-gpu's temporary memory)."""
        if gpu:
            from retrieval import gpu_ivf
            from retrieval.flat import DEFAULT_WORKSPACE_BYTES, TorchFlatIndex

            workspace = gpu_workspace_bytes or DEFAULT_WORKSPACE_BYTES
            if gpu_ivf.road(path) == "torch":
                return TorchFlatIndex.load(path, workspace_bytes=workspace)
            return DenseIndex(*gpu_ivf.load_to_gpus(path, import_faiss(), workspace))
        faiss = import_faiss()

        if not Path(path).is_file():
            raise FileNotFoundError(f"FAISS index not found: {path}")
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(path), flags)
        return DenseIndex(index)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def exact(self) -> bool:
        """A flat index: exact search, no recall to measure."""
        return type(import_faiss().downcast_index(self.index)).__name__.startswith("IndexFlat")

    @property
    def nprobe(self) -> Optional[int]:
        """The IVF lists searched per query (None for other indexes)."""
        ivf = import_faiss().try_extract_index_ivf(self.index)
        return None if ivf is None else int(ivf.nprobe)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)


def open_folder(folder: Path, manifest: dict, store, load):
    """The index of a built dense folder (``index.faiss``), on CPU or, with ``load.gpu``, on the GPUs."""
    return DenseIndex.load(folder / "index.faiss", mmap=load.mmap, gpu=load.gpu,
                           gpu_workspace_bytes=load.gpu_workspace_bytes)


def open_file(path: Path, store, load):
    """A released FAISS file without a manifest (Search-R1's ``e5_Flat.index``); needs ``load.encoder``."""
    if load.encoder is None:
        raise ValueError(f"{path} has no manifest: pass the encoder name (e.g. intfloat/e5-base-v2)")
    return DenseIndex.load(path, mmap=load.mmap, gpu=load.gpu, gpu_workspace_bytes=load.gpu_workspace_bytes)
