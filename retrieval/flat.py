"""Exact inner-product search over a FAISS flat index, in torch, sharded over devices.

Why not faiss-gpu: the PyPI ``faiss-gpu-cu12`` 1.14.1.post1 wheel carries GPU code for sm_70 and
sm_80 only and no PTX, so on an H100/H200 (sm_90) every search fails with "no kernel image is
available". A flat index needs no FAISS kernel: the scores are one matrix product. Here the
vectors are split into one shard per device (fp16 on GPUs: wiki-18's 21,015,324 x 768 e5 vectors
are 32 GB, 4 GB per GPU on 8), each device computes ``queries @ shard.T`` block by block and keeps
its top-k, and the shards' top-k are merged. It runs on every GPU architecture the installed torch
runs on, checked at start-up (:func:`check_cuda_devices`), and on CPU, where the tests compare it with
FAISS's own exact search.

The vectors are read straight from the ``.index`` file (:func:`read_flat_vectors`: a memory map of
the file's float32 block, no FAISS needed), so loading streams from disk to the devices with
bounded host memory.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from retrieval.cuda_arch import runs_on

# FAISS's on-disk IndexFlat: fourcc, d (int32), ntotal (int64), two int64 dummies, is_trained (uint8),
# metric_type (int32), [metric_arg (float32) when metric_type > 1], then the vectors as a float vector:
# their count (uint64) and ntotal * d float32 values.
_FOURCC = {b"IxFI": "inner product", b"IxF2": "L2"}
_HEADER = struct.Struct("<4siqqqBi")
METRIC_INNER_PRODUCT = 0


class FlatIndexError(ValueError):
    """The file is not a FAISS flat inner-product index this module can search."""


class UnsupportedGPU(RuntimeError):
    """A GPU the installed torch build has no kernels for (the message says what to install)."""


def read_flat_vectors(path: str | os.PathLike) -> np.ndarray:
    """The vectors of a FAISS ``IndexFlatIP`` file as a read-only ``(ntotal, d)`` float32 memory map."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FAISS index not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise FlatIndexError(f"{path}: {size} bytes, too short for a FAISS index header")
        fourcc, d, ntotal, _, _, _, metric = _HEADER.unpack(head)
        if fourcc not in _FOURCC:
            raise FlatIndexError(
                f"{path} is a FAISS index of type {fourcc.decode('latin-1')!r}, not a flat index (IxFI): GPU search "
                f"serves flat indexes only; serve HNSW/IVF indexes on CPU (without --gpu)")
        if metric != METRIC_INNER_PRODUCT:
            raise FlatIndexError(f"{path} is a flat {_FOURCC[fourcc]} index (metric {metric}); the retriever scores "
                                 f"by inner product (IndexFlatIP)")
        offset = _HEADER.size  # metric 0 (inner product): no metric_arg field
        f.seek(offset)
        (count,) = struct.unpack("<Q", f.read(8))
    offset += 8
    if d <= 0 or ntotal < 0 or count != ntotal * d or size != offset + 4 * count:
        raise FlatIndexError(f"{path}: header says {ntotal} vectors of dimension {d} ({count} floats), but the file "
                             f"has {size} bytes (expected {offset + 4 * ntotal * d}): truncated or not a flat index")
    return np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=(ntotal, d))


def check_cuda_devices(devices: Sequence[str], *, archs: Optional[Sequence[str]] = None, capability=None,
                       name=None) -> None:
    """Fail at start-up, naming the GPU and the fix, when the installed torch cannot run on a device.

    ``archs``/``capability``/``name`` default to torch's own answers (injectable for tests)."""
    import torch

    archs = list(torch.cuda.get_arch_list()) if archs is None else list(archs)
    for dev in devices:
        cap = capability(dev) if capability else torch.cuda.get_device_capability(dev)
        label = name(dev) if name else torch.cuda.get_device_name(dev)
        if not runs_on(tuple(cap), archs):
            raise UnsupportedGPU(
                f"{dev} ({label}, compute capability {cap[0]}.{cap[1]}, sm_{cap[0]}{cap[1]}) is not among the GPU "
                f"architectures this torch build has kernels for ({' '.join(archs) or 'none'}). Install a torch "
                f"build that includes sm_{cap[0]}{cap[1]} (torch 2.11.0 from PyPI, what `pip install -e '.[gpu]'` "
                f"installs, has sm_75 sm_80 sm_86 sm_90 sm_100 sm_120), or serve on CPU without --gpu.")


class TorchFlatIndex:
    """Exact top-k inner-product search; one shard of the vectors per device."""

    def __init__(self, shards: Sequence, block_rows: int = 1 << 20):
        self.shards = list(shards)
        self.starts = np.cumsum([0] + [int(s.shape[0]) for s in self.shards])[:-1].tolist()
        self.block_rows = int(block_rows)

    @staticmethod
    def load(path: str | os.PathLike, devices: Optional[Sequence[str]] = None, dtype=None,
             block_rows: int = 1 << 20, chunk_rows: int = 1 << 18, progress: bool = True) -> "TorchFlatIndex":
        """Shard the vectors of ``path`` over ``devices`` (default: every visible GPU), in ``dtype``
        (default fp16 on GPUs, fp32 on CPU), copied ``chunk_rows`` at a time from the memory map."""
        import torch
        from tqdm import tqdm

        vectors = read_flat_vectors(path)
        if devices is None:
            if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
                raise UnsupportedGPU("--gpu asked for, but torch sees no CUDA GPU (a CPU build of torch, no driver, "
                                     "or CUDA_VISIBLE_DEVICES empty); serve on CPU without --gpu")
            devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        devices = [str(d) for d in devices]
        cuda = [d for d in devices if d.startswith("cuda")]
        if cuda:
            check_cuda_devices(cuda)
        n = len(vectors)
        bounds = np.linspace(0, n, len(devices) + 1).astype(np.int64)
        shards = []
        bar = tqdm(total=n, unit="vec", unit_scale=True, desc=f"loading {Path(path).name} onto {len(devices)} device(s)",
                   disable=not progress)
        for dev, lo, hi in zip(devices, bounds[:-1], bounds[1:]):
            dt = dtype or (torch.float16 if dev.startswith("cuda") else torch.float32)
            shard = torch.empty((int(hi - lo), vectors.shape[1]), dtype=dt, device=dev)
            for i in range(int(lo), int(hi), chunk_rows):
                j = min(i + chunk_rows, int(hi))
                shard[i - lo: j - lo] = torch.from_numpy(np.array(vectors[i:j])).to(dev, dt)
                bar.update(j - i)
            shards.append(shard)
        bar.close()
        return TorchFlatIndex(shards, block_rows=block_rows)

    @property
    def ntotal(self) -> int:
        return int(sum(s.shape[0] for s in self.shards))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32 (B, k), ids int64 (B, k)), best first; FAISS's layout (-1 ids past ntotal)."""
        import torch

        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
        b = q.shape[0]
        parts_s, parts_i = [], []
        for shard, start in zip(self.shards, self.starts):
            qd = q.to(shard.device, shard.dtype)
            best_s = best_i = None
            for lo in range(0, shard.shape[0], self.block_rows):
                block = shard[lo: lo + self.block_rows]
                scores = (qd @ block.T).float()
                s, i = torch.topk(scores, min(k, block.shape[0]), dim=1)
                i = i + (start + lo)
                if best_s is not None:
                    s, pick = torch.topk(torch.cat([best_s, s], 1), min(k, best_s.shape[1] + s.shape[1]), dim=1)
                    i = torch.gather(torch.cat([best_i, i], 1), 1, pick)
                best_s, best_i = s, i
            if best_s is not None:
                parts_s.append(best_s.cpu())
                parts_i.append(best_i.cpu())
        out_s = np.full((b, k), -np.inf, dtype=np.float32)
        out_i = np.full((b, k), -1, dtype=np.int64)
        if parts_s:
            s, pick = torch.topk(torch.cat(parts_s, 1), min(k, sum(p.shape[1] for p in parts_s)), dim=1)
            i = torch.gather(torch.cat(parts_i, 1), 1, pick)
            out_s[:, : s.shape[1]], out_i[:, : i.shape[1]] = s.numpy(), i.numpy()
        return out_s, out_i
