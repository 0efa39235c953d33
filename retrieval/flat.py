"""Exact inner-product search over a FAISS flat index, in torch, sharded over devices.

Why not faiss-gpu for flat indexes: a flat index needs no FAISS kernel (the scores are one matrix
product), so it runs on every GPU torch runs on, in fp16 with fp32 scores, beside training's torch;
faiss-gpu (the ``gpu`` extra, 1.15.1: sm_70-sm_90 code) serves IVF indexes (:mod:`retrieval.gpu_ivf`).
The older PyPI ``faiss-gpu-cu12`` 1.14.1.post1 wheel had sm_70 and sm_80 code only, no PTX: on an
H100/H200 (sm_90) every search failed with "no kernel image is available". Here the
vectors are split into one shard per device (fp16 on GPUs: wiki-18's 21,015,324 x 768 e5 vectors
are 32 GB, 4 GB per GPU on 8), each device computes ``queries @ shard.T`` block by block and keeps
its top-k, and the shards' top-k are merged. It runs on every GPU architecture the installed torch
runs on, checked at start-up (:func:`check_cuda_devices`), and on CPU, where the tests compare it with
FAISS's own exact search.

Search is launched on every device before any result is copied back (CUDA work is asynchronous until
a host sync), so the GPUs work at the same time; only then are the per-shard top-k collected and merged.

Scores are fp32, as FAISS's (Search-R1's retriever) are, also from fp16 shards: an fp16 product
would round each score to 11 significant bits before the top-k and reorder near-ties. On CUDA,
``torch.mm(a, b, torch.float32)`` (the ``mm.dtype`` overload, torch >= 2.8, CUDA only and only for
fp16/bf16 inputs) reads the fp16 shard as it is, multiplies exactly (an fp16 x fp16 product fits in
fp32) and accumulates and writes fp32: no fp32 copy of the shard, tensor-core speed. Its inputs must
both be fp16, so the fp32 query is split in two fp16 halves, ``q ~= hi + lo * eps`` (``lo`` is the
rounding residual scaled by ``1/eps``, a power of two, so it stays out of fp16's subnormals), and one
product of the stacked halves gives ``hi.x + eps * lo.x`` -- the query kept to ~22 bits instead of 11,
for the price of a second row per query in a bandwidth-bound product. Where that overload is missing
(CPU, older torch; probed once per shard), each block is upcast to fp32 and multiplied with the fp32
query: exact fp32 too, at the cost of ``4 * d`` bytes per block row of workspace and fp32 (non-tensor-
core) speed. Upcasting the whole shard was not chosen: it would double its memory. (fp32 products on
CUDA follow torch's TF32 setting, off by default.)

The search workspace per device is bounded in bytes (``workspace_bytes``): the block rows, and where
needed the number of queries per product, are derived from it and the batch size (:func:`plan_blocks`),
since torch's caching allocator keeps the largest block it ever served beside the training job.

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
                f"{path} is a FAISS index of type {fourcc.decode('latin-1')!r}, not a flat index (IxFI): the torch "
                f"GPU search serves flat indexes only (IVF indexes go to faiss-gpu: DenseIndex.load); serve other "
                f"kinds on CPU (without --gpu)")
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
                f"installs, has sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_103 sm_120 sm_121), or serve on CPU "
                f"without --gpu.")


# 256 MiB of scratch per device: at the server's default batch of 256 queries that is 262,144 fp32
# score rows (131,072 with the two fp16 query halves), so a wiki-18 shard on 8 GPUs (2.6M rows) is
# ~20 products per search, each reading ~200 MB of shard -- big enough to keep the GPU busy rather
# than the Python launch loop -- while the caching allocator keeps under 0.2% of an H200 (0.3% of an
# 80 GB H100) beside the training job. The old fixed 1<<20 rows took 2 GiB at 512 queries.
DEFAULT_WORKSPACE_BYTES = 256 << 20
_ROW_ALIGN = 128  # block rows rounded down to a multiple of this (GEMM tile width) when that costs < half


def plan_blocks(batch: int, k: int, rows_total: int, workspace_bytes: int, *, bytes_per_score: int = 4,
                bytes_per_row: int = 0, max_rows: Optional[int] = None) -> tuple[int, int]:
    """``(queries per product, block rows)`` for one shard, so that a product's workspace,
    ``rows * (bytes_per_score * queries + bytes_per_row)``, stays within ``workspace_bytes``.

    Block rows are at least ``min(k, rows_total)`` where the budget allows (so merging two blocks'
    top-k costs no more than a block); when the whole batch does not fit at that many rows, the batch
    is split into equal chunks that do. ``bytes_per_row`` is per-block scratch that does not grow with
    the batch (an fp32 copy of the block). At least one query and one row, whatever the budget."""
    if batch < 1 or rows_total < 1:
        return max(batch, 0), 0
    cap = rows_total if max_rows is None else max(1, min(rows_total, int(max_rows)))
    want = min(max(k, 1), cap)

    def rows_for(chunk: int) -> int:
        return workspace_bytes // (bytes_per_score * chunk + bytes_per_row)

    chunk = batch
    if rows_for(chunk) < want:
        fit = max(1, (workspace_bytes // want - bytes_per_row) // bytes_per_score)
        pieces = -(-batch // fit)
        chunk = -(-batch // pieces)  # equal chunks, each <= fit
    rows = min(max(rows_for(chunk), 1), cap)
    if rows < cap and rows >= 2 * _ROW_ALIGN:
        rows -= rows % _ROW_ALIGN
    return chunk, rows


def _mm_fp32_out(a, b):
    """``a @ b`` of fp16/bf16 matrices, accumulated and returned in fp32 (torch >= 2.8, CUDA only).
    Passed positionally: the ``mm.dtype`` overload takes ``out_dtype`` as its third argument."""
    import torch

    return torch.mm(a, b, torch.float32)


def _has_fp32_out_mm(device, dtype) -> bool:
    """Whether :func:`_mm_fp32_out` runs for ``dtype`` matrices on ``device`` (a tiny product, the
    layout search uses: a row-major query times a transposed block)."""
    import torch

    try:
        a = torch.zeros((2, 8), dtype=dtype, device=device)
        b = torch.zeros((4, 8), dtype=dtype, device=device)
        return _mm_fp32_out(a, b.T).dtype == torch.float32
    except (RuntimeError, TypeError):  # NotImplementedError (no kernel for the device) is a RuntimeError
        return False


class TorchFlatIndex:
    """Exact top-k inner-product search; one shard of the vectors per device.

    ``shards``: torch tensors ``(n_i, d)`` on any devices (fp32, fp16 or bf16); ids run on from one
    shard to the next. ``workspace_bytes``: scratch per device and search (see :func:`plan_blocks`);
    ``block_rows``: an optional further cap on the rows per product."""

    def __init__(self, shards: Sequence, block_rows: Optional[int] = None,
                 workspace_bytes: int = DEFAULT_WORKSPACE_BYTES):
        import torch

        if int(workspace_bytes) <= 0:
            raise ValueError(f"workspace_bytes must be > 0, got {workspace_bytes}")
        self.shards = list(shards)
        self.starts = np.cumsum([0] + [int(s.shape[0]) for s in self.shards])[:-1].tolist()
        self.block_rows = None if block_rows is None else int(block_rows)
        self.workspace_bytes = int(workspace_bytes)
        # per shard: "fp32" (fp32 shard), "split" (fp16/bf16 shard, fp32-output product of the two query
        # halves) or "upcast" (fp16/bf16 shard, each block copied to fp32 first)
        self.modes = []
        for s in self.shards:
            if s.dtype == torch.float32:
                self.modes.append("fp32")
            elif s.dtype in (torch.float16, torch.bfloat16) and _has_fp32_out_mm(s.device, s.dtype):
                self.modes.append("split")
            else:
                self.modes.append("upcast")

    @staticmethod
    def load(path: str | os.PathLike, devices: Optional[Sequence[str]] = None, dtype=None,
             block_rows: Optional[int] = None, chunk_rows: int = 1 << 18, progress: bool = True,
             workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> "TorchFlatIndex":
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
        bar = tqdm(total=n, unit="vec", unit_scale=True,
                   desc=f"loading {Path(path).name} onto {len(devices)} device(s)",
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
        return TorchFlatIndex(shards, block_rows=block_rows, workspace_bytes=workspace_bytes)

    @property
    def ntotal(self) -> int:
        return int(sum(s.shape[0] for s in self.shards))

    def plan(self, shard_no: int, batch: int, k: int, mode: Optional[str] = None) -> tuple[int, int]:
        """``(queries per product, block rows)`` of shard ``shard_no`` for a search of ``batch`` queries."""
        shard, mode = self.shards[shard_no], mode or self.modes[shard_no]
        return plan_blocks(batch, k, int(shard.shape[0]), self.workspace_bytes,
                           bytes_per_score=8 if mode == "split" else 4,
                           bytes_per_row=4 * int(shard.shape[1]) if mode == "upcast" else 0,
                           max_rows=self.block_rows)

    @staticmethod
    def _scores(mode: str, qd, block):
        """fp32 ``(chunk, rows)`` scores of one block; ``qd`` as :meth:`_device_queries` made it."""
        import torch

        if mode == "split":
            both = _mm_fp32_out(qd, block.T)  # (2 * chunk, rows): hi.x over lo.x
            half = both.shape[0] // 2
            scores = both[:half]
            scores.add_(both[half:], alpha=torch.finfo(block.dtype).eps)  # hi.x + eps * lo.x, in place
            return scores
        if mode == "upcast":
            return qd @ block.float().T
        return qd @ block.T

    @staticmethod
    def _device_queries(mode: str, q, dtype):
        """The fp32 queries ``q`` (on the shard's device) in the form :meth:`_scores` takes."""
        import torch

        if mode != "split":
            return q
        hi = q.to(dtype)
        lo = ((q - hi.float()) * (1.0 / torch.finfo(dtype).eps)).to(dtype)  # the residual is exact in fp32
        return torch.cat([hi, lo])

    def _shard_topk(self, shard_no: int, q, k: int, fits_fp16: bool):
        """A generator that queues one block's work on the shard's device per step (no host sync) and
        returns the shard's ``(scores, ids)`` top-k, still on the device."""
        import torch

        shard, start = self.shards[shard_no], self.starts[shard_no]
        mode = self.modes[shard_no]
        if mode == "split" and shard.dtype == torch.float16 and not fits_fp16:
            mode = "upcast"  # a query component beyond fp16's range: the fp32 road for this search
        b = q.shape[0]
        chunk, rows = self.plan(shard_no, b, k, mode)
        qdev = q.to(shard.device, non_blocking=True)
        out_s, out_i = [], []
        for c0 in range(0, b, chunk):
            qd = self._device_queries(mode, qdev[c0: c0 + chunk], shard.dtype)
            best_s = best_i = None
            for lo in range(0, shard.shape[0], rows):
                block = shard[lo: lo + rows]
                scores = self._scores(mode, qd, block)
                s, i = torch.topk(scores, min(k, block.shape[0]), dim=1)
                i = i + (start + lo)
                if best_s is not None:
                    s, pick = torch.topk(torch.cat([best_s, s], 1), min(k, best_s.shape[1] + s.shape[1]), dim=1)
                    i = torch.gather(torch.cat([best_i, i], 1), 1, pick)
                best_s, best_i = s, i
                yield
            out_s.append(best_s)
            out_i.append(best_i)
        return torch.cat(out_s), torch.cat(out_i)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32 (B, k), ids int64 (B, k)), best first; FAISS's layout (-1 ids past ntotal)."""
        import torch

        q_np = np.ascontiguousarray(queries, dtype=np.float32)
        if q_np.ndim != 2:
            raise ValueError(f"queries must be a (B, d) matrix, got shape {q_np.shape}")
        b, k = q_np.shape[0], int(k)
        out_s = np.full((b, max(k, 0)), -np.inf, dtype=np.float32)
        out_i = np.full((b, max(k, 0)), -1, dtype=np.int64)
        live = [j for j, s in enumerate(self.shards) if s.shape[0] > 0]
        if b == 0 or k < 1 or not live:
            return out_s, out_i
        fits_fp16 = float(np.abs(q_np).max()) < float(torch.finfo(torch.float16).max)  # on the host: no sync
        q = torch.from_numpy(q_np)
        if any(self.shards[j].device.type == "cuda" for j in live):
            q = q.pin_memory()  # so the copies to the GPUs are asynchronous
        # 1. launch: one block per device in turn, so every device has work queued at once
        steps = {j: self._shard_topk(j, q, k, fits_fp16) for j in live}
        on_device = {}
        while steps:
            for j in list(steps):
                try:
                    next(steps[j])
                except StopIteration as done:
                    on_device[j] = done.value
                    del steps[j]
        # 2. collect (each copy waits for its own device only; the others keep computing), 3. merge
        parts = [(on_device[j][0].cpu(), on_device[j][1].cpu()) for j in live]
        s, pick = torch.topk(torch.cat([p[0] for p in parts], 1), min(k, sum(p[0].shape[1] for p in parts)), dim=1)
        i = torch.gather(torch.cat([p[1] for p in parts], 1), 1, pick)
        out_s[:, : s.shape[1]], out_i[:, : i.shape[1]] = s.numpy(), i.numpy()
        return out_s, out_i
