"""Attention on verl's packed micro-batches (not a test): paths whose cost follows the sequences, not the pack.

    python bench/bench_attention.py [--quick] [--device cpu|cuda] [--dtype fp32|bf16|fp16]
                                    [--tokens 16384] [--heads 16 --kv-heads 2 --head-dim 128] [--backward]
                                    [--paths abcde] [--reps 1] [--flex-eager]

verl's "remove padding" passes give the model one row of ``tokens`` packed tokens (input_ids (1, T)), the
position ids restarting at 0 for each sequence and no attention mask. Each path below attends the same
q, k, v (one attention layer of Qwen2.5-3B's shape: 16 query heads, 2 KV heads, head_dim 128, unless
scaled down with --heads / --kv-heads) over a pack of sequences of seeded random lengths:

  (a) dense:  transformers' SDPA path as the presets run it: ``create_causal_mask`` finds the packed
      sequences in the position ids and builds a dense (1, 1, T, T) block-diagonal causal bool mask,
      and ``sdpa_attention_forward`` hands it to torch's SDPA (a kernel with a mask visits every key);
  (b) flex:   transformers' ``flex_attention`` path: the same ``create_causal_mask`` builds a BlockMask
      (torch's ``create_block_mask``, compiled) and ``flex_attention_forward`` runs torch.compile'd
      flex_attention, which skips the 128 x 128 blocks outside each document; if compiling fails, the
      error is reported and the eager (unfused, dense-materialising) flex_attention is measured instead;
  (c) varlen: torch's ``torch.nn.attention.varlen.varlen_attn`` over cumulative sequence lengths
      (Flash Attention kernels in torch's CUDA build; reported n/a where the device has no kernel);
  (d) per-sequence: SDPA with ``is_causal=True`` on each sequence in turn (no mask: the cost follows the
      sequences; a lower bound of what a document-sparse kernel can reach);
  (e) smaller packs: the same sequences packed first-fit-decreasing into packs of at most
      ``--small-pack`` tokens (8,192: the longest trajectory, 2,048 prompt + 4,096 response, still fits),
      path (a) on each pack; its time is the sum over the packs (the same tokens as (a)).

For each path: ms per forward of the whole pack's tokens (the mask is built once per model forward and
shared by all layers, so it is timed apart, in "mask ms"), the ratio to (a), the analytic attention FLOP
ratio to (a) (causal work: T^2/2 for the dense pack, sum L_i^2/2 for the document-aware paths, sum over
packs P_j^2/2 for (e)) and the max abs difference of the output from (a)'s. With --backward also
forward + backward (gradients of q, k, v under a fixed random output gradient) and their max abs diff.
A path that disagrees with (a) beyond the dtype's tolerance is a bug: the script then exits 1. The tolerance
is absolute in fp32 (1e-4) and relative to the magnitude in bf16 / fp16: 8 units in the last place of max |(a)|,
per compared tensor (``tolerance``: a correct bf16 path differs by rounding alone, ~2 ulps of its largest values;
a wrong mask by the values' own size).

CPU times are not GPU times; the FLOP ratios are what carries over to a GPU.
"""

from __future__ import annotations

import argparse
import inspect
import math
import random
import sys
import time
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: fp32: the max abs difference from (a) a correct path stays under (an absolute bound: fp32 rounding is ~1e-7
#: relative, and these outputs and gradients stay within ~10^2 of 1)
TOLERANCE = {"fp32": 1e-4}
#: bf16 / fp16: the kernels round differently (intermediates such as the probabilities are stored in the low
#: precision, the GQA heads are summed in it), so a correct path differs from (a) by a few units in the last place
#: of the largest values; the bound is ULPS of those units, taken at max |(a)| of each compared tensor (bf16: 8 x
#: 2^-7 x 2^floor(log2 max|ref|), 3.1-6.3 % of max |ref|; a wrong mask differs by the values' own size). Measured on
#: CPU at 1-2k tokens: correct gradients within 2.5 bf16 ulps of max |ref|, a merged pair of sequences ~80-100 %.
ULPS = {"bf16": 8, "fp16": 8}
FLEX_BLOCK = 128  # torch.nn.attention.flex_attention._DEFAULT_SPARSE_BLOCK_SIZE

#: Qwen2.5-3B (config.json): for the whole-model FLOP estimate printed after the table
QWEN25_3B = dict(hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, head_dim=128, vocab=151936)


class Unavailable(RuntimeError):
    """A path that cannot run here (no kernel for the device, no module in this torch, ...)."""


# ----------------------------------------------------------------------------------------------- inputs


def draw_lengths(tokens: int, lo: int, hi: int, seed: int = 0) -> list[int]:
    """Sequence lengths drawn uniformly in [lo, hi] (seeded) until they fill ``tokens``; the last one is cut
    to what is left, so the pack holds exactly ``tokens`` tokens, as a full micro-batch does."""
    rng, lengths = random.Random(seed), []
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(lo, hi), tokens - sum(lengths)))
    return lengths


def position_ids_of(lengths: list[int], device="cpu") -> torch.Tensor:
    """verl's packed position ids: (1, T), restarting at 0 for each sequence."""
    return torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)


def make_qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype=torch.float32, device="cpu",
             seed: int = 0, requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (1, heads, T, D), k and v (1, kv_heads, T, D), as a Qwen2 attention layer hands them to the kernel."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, tokens, head_dim, generator=g).to(device=device, dtype=dtype)
               for h in (heads, kv_heads, kv_heads))
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def first_fit_decreasing(lengths: list[int], cap: int) -> list[list[int]]:
    """Sequence indices per pack of at most ``cap`` tokens (longest first into the first pack with room);
    each pack lists its sequences in their original order."""
    if max(lengths) > cap:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a pack of {cap}")
    packs: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = next((j for j, r in enumerate(room) if r >= lengths[i]), None)
        if j is None:
            packs.append([])
            room.append(cap)
            j = len(packs) - 1
        packs[j].append(i)
        room[j] -= lengths[i]
    return [sorted(p) for p in packs]


# ------------------------------------------------------------------------------------------ FLOP counts


def dense_causal_work(tokens: int) -> float:
    """Score entries (query-key pairs) of causal attention over one pack of ``tokens``: T^2/2."""
    return tokens * tokens / 2


def document_work(lengths: list[int]) -> float:
    """Score entries of causal attention within each sequence only: sum of L_i^2/2."""
    return sum(n * n / 2 for n in lengths)


def flop_ratio(path: str, lengths: list[int], small_packs: list[list[int]] | None = None) -> float:
    """Analytic attention FLOPs of ``path`` over (a)'s (FLOPs = 4 x heads x head_dim per score entry, the
    same factor for every path, so the ratio is one of score entries)."""
    dense = dense_causal_work(sum(lengths))
    if path == "a":
        return 1.0
    if path in ("b", "c", "d"):
        return document_work(lengths) / dense
    if path == "e":
        return sum(dense_causal_work(sum(lengths[i] for i in p)) for p in small_packs) / dense
    raise ValueError(path)


def attention_gflop(work: float, heads: int, head_dim: int) -> float:
    """Forward FLOPs of attention over ``work`` score entries: QK^T and PV, 2 flops per multiply-add each."""
    return 4 * heads * head_dim * work / 1e9


# ------------------------------------------------------------------------------------- transformers glue


class _AttnModule(torch.nn.Module):
    """What transformers' attention functions read from the attention layer (Qwen2Attention's fields)."""

    def __init__(self, heads: int, kv_heads: int, training: bool = False):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True
        self.train(training)


def hf_config(impl: str, heads: int, kv_heads: int, head_dim: int):
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, num_hidden_layers=1, intermediate_size=64, vocab_size=64)
    config._attn_implementation = impl
    return config


def hf_packed_mask(impl: str, position_ids: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                   dtype=torch.float32):
    """The mask transformers builds for ``impl`` from verl's packed position ids (attention_mask None, no
    cache): a dense bool (1, 1, T, T) for sdpa, a BlockMask for flex_attention."""
    from transformers.masking_utils import create_causal_mask

    tokens = position_ids.shape[-1]
    embeds = torch.empty(1, tokens, 1, dtype=dtype, device=position_ids.device)  # only shape / dtype / device are read
    return create_causal_mask(hf_config(impl, heads, kv_heads, head_dim), embeds, None, None,
                              position_ids=position_ids)


def _flat(out: torch.Tensor) -> torch.Tensor:
    """(1, T, H, D) -> (T, H, D)"""
    return out[0]


# ------------------------------------------------------------------------------------------------ paths


def dense_sdpa(q, k, v, mask, module) -> torch.Tensor:
    """(a): transformers' sdpa_attention_forward with the dense block-diagonal mask: (T, H, D)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)
    return _flat(out)


@dataclass
class FlexRunner:
    """(b): transformers' flex_attention_forward (compiles torch's flex_attention on first use). ``compile``
    False, or a failed compile, runs torch's eager flex_attention on the same BlockMask instead (unfused:
    it materialises the whole score matrix); ``compile_error`` says why."""

    compile: bool = True
    compile_error: str | None = None
    notes: list[str] = field(default_factory=list)

    def __call__(self, q, k, v, block_mask, module) -> torch.Tensor:
        if self.compile and self.compile_error is None:
            from transformers.integrations.flex_attention import flex_attention_forward

            try:
                out, _ = flex_attention_forward(module, q, k, v, block_mask, scaling=q.shape[-1] ** -0.5)
                return _flat(out)
            except NotImplementedError:
                raise  # e.g. "FlexAttention does not support backward on CPU": not a compile failure
            except Exception as e:  # noqa: BLE001  (inductor / triton / compiler errors)
                if "does not support backward" in str(e):  # raised while tracing: torch's device check, not compile
                    raise NotImplementedError(str(e).splitlines()[0]) from e
                self.compile_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                self.notes.append(f"flex compile failed, eager flex measured instead: {self.compile_error}")
        from torch.nn.attention.flex_attention import flex_attention

        out = flex_attention(q, k, v, block_mask=block_mask, scale=q.shape[-1] ** -0.5,
                             enable_gqa=q.shape[1] != k.shape[1])
        return out[0].transpose(0, 1)


def varlen(q, k, v, lengths: list[int]) -> torch.Tensor:
    """(c): torch.nn.attention.varlen.varlen_attn, causal (window (-1, 0)), over cumulative lengths."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        raise Unavailable(f"no torch.nn.attention.varlen in torch {torch.__version__}") from e
    qt, kt, vt = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))  # (T, H, D)
    kwargs = {}
    if qt.shape[1] != kt.shape[1]:
        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            kwargs["enable_gqa"] = True
        else:  # torch 2.11's varlen_attn has no enable_gqa: repeat the KV heads
            rep = qt.shape[1] // kt.shape[1]
            kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
    cu = torch.tensor([0, *accumulate(lengths)], dtype=torch.int32, device=q.device)
    try:
        return varlen_attn(qt, kt, vt, cu, cu, max(lengths), max(lengths), window_size=(-1, 0), **kwargs)
    except (NotImplementedError, RuntimeError) as e:
        raise Unavailable(f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from e


def per_sequence(q, k, v, lengths: list[int], module) -> torch.Tensor:
    """(d): transformers' sdpa_attention_forward on each sequence, no mask (is_causal=True, GQA in SDPA)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    outs, start = [], 0
    for n in lengths:
        s = slice(start, start + n)
        out, _ = sdpa_attention_forward(module, q[:, :, s], k[:, :, s], v[:, :, s], None, scaling=q.shape[-1] ** -0.5)
        outs.append(_flat(out))
        start += n
    return torch.cat(outs)


@dataclass
class SmallPacks:
    """(e): the sequences regrouped into packs (``first_fit_decreasing``), each with its own dense mask."""

    index: list[torch.Tensor]  # per pack: the token positions (in the big pack) of its sequences, in order
    masks: list[torch.Tensor]
    inverse: torch.Tensor  # positions of the big pack's tokens in the concatenated small packs

    @classmethod
    def build(cls, lengths: list[int], packs: list[list[int]], heads: int, kv_heads: int, head_dim: int,
              dtype, device) -> SmallPacks:
        starts = [0, *accumulate(lengths)]
        index, masks = [], []
        for p in packs:
            index.append(torch.cat([torch.arange(starts[i], starts[i + 1], device=device) for i in p]))
            masks.append(hf_packed_mask("sdpa", position_ids_of([lengths[i] for i in p], device), heads, kv_heads,
                                        head_dim, dtype))
        order = torch.cat(index)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=device)
        return cls(index, masks, inverse)

    def __call__(self, q, k, v, module) -> torch.Tensor:
        outs = [dense_sdpa(q[:, :, i], k[:, :, i], v[:, :, i], m, module) for i, m in zip(self.index, self.masks)]
        return torch.cat(outs)[self.inverse]


# ---------------------------------------------------------------------------------------------- timing


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, warmup: int, reps: int):
    """(result of the last call, best ms of ``reps`` calls after ``warmup`` untimed ones)."""
    result = None
    for _ in range(warmup):
        result = fn()
    _sync(device)
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        _sync(device)
        best = min(best, (time.perf_counter() - start) * 1e3)
    return result, best


def forward_backward(fn, q, k, v, grad_out):
    """Gradients of q, k, v of <fn(q, k, v), grad_out>."""
    out = fn(q, k, v)
    return torch.autograd.grad(out, (q, k, v), grad_out)


def max_abs_diff(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item()


def dtype_name(dtype) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def ulp(magnitude: float, dtype) -> float:
    """The spacing of ``dtype``'s numbers at ``magnitude`` (one unit in the last place): eps x 2^floor(log2 m)."""
    if magnitude <= 0 or not math.isfinite(magnitude):
        return 0.0 if magnitude <= 0 else math.inf
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


def tolerance(ref: torch.Tensor, dtype) -> float:
    """Max abs difference from ``ref`` that a correct path may show: fp32 an absolute TOLERANCE; bf16 / fp16
    ULPS units in the last place of max |ref| (the rounding of the largest values, relative to the magnitude)."""
    name = dtype_name(dtype)
    if name in TOLERANCE:
        return TOLERANCE[name]
    return ULPS[name] * ulp(ref.float().abs().max().item(), dtype)


@dataclass
class Agreement:
    """A path's output (or gradients) against (a)'s: the max abs difference over all tensors and, for the
    tensor closest to its bound, its difference and bound."""

    diff: float
    worst_diff: float
    worst_tol: float

    @property
    def ok(self) -> bool:
        return self.worst_diff <= self.worst_tol

    def describe(self, dtype) -> str:
        name = dtype_name(dtype)
        how = (f"{ULPS[name]} {name} ulps of max |ref|" if name in ULPS else f"{name} absolute")
        return f"{self.diff:.1e} (worst {self.worst_diff:.1e} {'<=' if self.ok else '>'} {self.worst_tol:.1e}: {how})"


def agreement(got, ref, dtype) -> Agreement:
    """Compare each tensor of ``got`` with ``ref``'s against its own :func:`tolerance` (q, k and v gradients
    have different magnitudes)."""
    pairs = list(zip(got, ref)) if isinstance(got, (tuple, list)) else [(got, ref)]
    worst = None
    for a, b in pairs:
        d, t = max_abs_diff(a, b), tolerance(b, dtype)
        ratio = d / t if t > 0 else (0.0 if d == 0 else math.inf)
        if worst is None or ratio > worst[0]:
            worst = (ratio, d, t)
    return Agreement(max(max_abs_diff(a, b) for a, b in pairs), worst[1], worst[2])


# ------------------------------------------------------------------------------------------------- main


@dataclass
class Row:
    path: str
    tokens: str
    flops: float
    fwd_ms: float | None = None
    diff: float | None = None
    mask_ms: float | None = None
    fb_ms: float | None = None
    fb_diff: float | None = None
    note: str = ""
    agree: Agreement | None = None  # the output against (a)'s
    fb_agree: Agreement | None = None  # the gradients against (a)'s

    def compare(self, out, ref, dtype) -> None:
        self.agree = agreement(out, ref, dtype)
        self.diff = self.agree.diff

    def compare_grads(self, grads, ref_grads, dtype) -> None:
        self.fb_agree = agreement(grads, ref_grads, dtype)
        self.fb_diff = self.fb_agree.diff

    @property
    def bad(self) -> bool:
        return any(a is not None and not a.ok for a in (self.agree, self.fb_agree))


def _fmt(x, spec: str, na: str = "n/a") -> str:
    return na if x is None else format(x, spec)


def run(args) -> int:
    device, dtype = args.device, DTYPES[args.dtype]
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False here")
    torch.manual_seed(args.seed)
    lengths = draw_lengths(args.tokens, args.min_len, args.max_len, args.seed)
    packs = first_fit_decreasing(lengths, args.small_pack)
    tokens, heads, kv, dim = args.tokens, args.heads, args.kv_heads, args.head_dim
    pos = position_ids_of(lengths, device)
    q, k, v = make_qkv(tokens, heads, kv, dim, dtype, device, args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    grad_out = torch.randn(tokens, heads, dim, generator=g).to(device, dtype)
    module = _AttnModule(heads, kv, training=False)
    train_module = _AttnModule(heads, kv, training=True)
    reps, compiled_warmup = args.reps, 1
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, {device}, {args.dtype}, "
          f"{torch.get_num_threads()} threads; q heads {heads}, KV heads {kv}, head_dim {dim}; "
          f"pack of {tokens} tokens: "
          f"{len(lengths)} sequences {lengths} (seed {args.seed}, lengths in [{args.min_len}, {args.max_len}], the "
          f"last cut to fill the pack); (e): {len(packs)} packs of <= {args.small_pack}: "
          f"{[sum(lengths[i] for i in p) for p in packs]}", flush=True)

    rows: list[Row] = []
    notes: list[str] = []

    hf_packed_mask("sdpa", position_ids_of([2, 2], device), heads, kv, dim, dtype)  # first-call imports, untimed
    # (a) the reference: transformers' dense mask + SDPA (always run: the others are compared with it)
    t0 = time.perf_counter()
    dense_mask = hf_packed_mask("sdpa", pos, heads, kv, dim, dtype)
    _sync(device)
    a = Row("(a) SDPA, dense block-diagonal mask (today)", f"{tokens}", 1.0, mask_ms=(time.perf_counter() - t0) * 1e3)
    fa = lambda q_, k_, v_, m=module: dense_sdpa(q_, k_, v_, dense_mask, m)  # noqa: E731
    ref, a.fwd_ms = timed(lambda: fa(q, k, v), device, 0, reps)
    a.diff = 0.0
    rows.append(a)
    print(f"  (a) {a.fwd_ms:.1f} ms", flush=True)

    # (b) flex_attention with transformers' BlockMask
    block_mask = None
    flex = FlexRunner(compile=not args.flex_eager)
    b = Row("(b) flex_attention, document BlockMask" + (" (eager)" if args.flex_eager else ""), f"{tokens}",
            flop_ratio("b", lengths))
    try:
        if "b" not in args.paths:
            raise Unavailable("not run (--paths)")
        t0 = time.perf_counter()
        block_mask = hf_packed_mask("flex_attention", pos, heads, kv, dim, dtype)  # compiles create_block_mask
        _sync(device)
        first_mask_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        block_mask = hf_packed_mask("flex_attention", pos, heads, kv, dim, dtype)
        _sync(device)
        b.mask_ms = (time.perf_counter() - t0) * 1e3
        nb = math.ceil(tokens / FLEX_BLOCK)
        visited = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
        notes.append(f"(b) BlockMask: first build (compiles create_block_mask) {first_mask_ms / 1e3:.1f} s; visits "
                     f"{visited} of {nb * nb} {FLEX_BLOCK}x{FLEX_BLOCK} blocks = {visited / (nb * nb / 2):.3f} of "
                     f"(a)'s causal half ({visited - int(block_mask.kv_num_blocks.sum())} full, the rest partial)")
        t0 = time.perf_counter()
        out = flex(q, k, v, block_mask, module)  # the compile
        _sync(device)
        notes.append(f"(b) first call (torch.compile of flex_attention) {time.perf_counter() - t0:.1f} s"
                     + (f"; {flex.compile_error}" if flex.compile_error else ""))
        out, b.fwd_ms = timed(lambda: flex(q, k, v, block_mask, module), device, 0, reps)
        b.compare(out, ref, dtype)
        if flex.compile_error:
            b.note = "compile failed: eager (dense) flex measured"
    except Unavailable as e:
        b.note = str(e)
    rows.append(b)
    print(f"  (b) {_fmt(b.fwd_ms, '.1f')} ms", flush=True)

    # (c) torch's varlen_attn
    c = Row("(c) torch varlen_attn (cu_seqlens)", f"{tokens}", flop_ratio("c", lengths))
    try:
        if "c" not in args.paths:
            raise Unavailable("not run (--paths)")
        out, c.fwd_ms = timed(lambda: varlen(q, k, v, lengths), device, 1, reps)
        c.compare(out, ref, dtype)
    except Unavailable as e:
        c.note = str(e)
    rows.append(c)
    print(f"  (c) {_fmt(c.fwd_ms, '.1f')} ms {c.note}", flush=True)

    # (d) per-sequence SDPA, is_causal
    d = Row("(d) SDPA per sequence, is_causal=True", f"{len(lengths)} x {round(tokens / len(lengths))} avg",
            flop_ratio("d", lengths))
    if "d" in args.paths:
        out, d.fwd_ms = timed(lambda: per_sequence(q, k, v, lengths, module), device, 0, reps)
        d.compare(out, ref, dtype)
    else:
        d.note = "not run (--paths)"
    rows.append(d)
    print(f"  (d) {d.fwd_ms:.1f} ms", flush=True)

    # (e) smaller packs
    t0 = time.perf_counter()
    small = SmallPacks.build(lengths, packs, heads, kv, dim, dtype, device)
    _sync(device)
    e = Row(f"(e) SDPA dense mask, packs <= {args.small_pack}", " + ".join(str(len(i)) for i in small.index),
            flop_ratio("e", lengths, packs), mask_ms=(time.perf_counter() - t0) * 1e3)
    if "e" in args.paths:
        out, e.fwd_ms = timed(lambda: small(q, k, v, module), device, 0, reps)
        e.compare(out, ref, dtype)
    else:
        e.note = "not run (--paths)"
    rows.append(e)
    print(f"  (e) {e.fwd_ms:.1f} ms", flush=True)

    if args.backward:
        qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
        fns = {
            "a": lambda q_, k_, v_: dense_sdpa(q_, k_, v_, dense_mask, train_module),
            "b": lambda q_, k_, v_: flex(q_, k_, v_, block_mask, train_module),
            "c": lambda q_, k_, v_: varlen(q_, k_, v_, lengths),
            "d": lambda q_, k_, v_: per_sequence(q_, k_, v_, lengths, train_module),
            "e": lambda q_, k_, v_: small(q_, k_, v_, train_module),
        }
        ref_grads, a.fb_ms = timed(lambda: forward_backward(fns["a"], qg, kg, vg, grad_out), device, 0, reps)
        a.fb_diff = 0.0
        print(f"  (a) fwd+bwd {a.fb_ms:.1f} ms", flush=True)
        for key, row in zip("bcde", rows[1:]):
            if row.fwd_ms is None:
                continue
            try:
                warm = compiled_warmup if key in "bc" else 0
                grads, row.fb_ms = timed(lambda: forward_backward(fns[key], qg, kg, vg, grad_out), device, warm, reps)
                row.compare_grads(grads, ref_grads, dtype)
            except (NotImplementedError, Unavailable) as err:
                msg = str(err).splitlines()[0][:120]
                row.note = (row.note + "; " if row.note else "") + f"backward: {msg}"
            print(f"  ({key}) fwd+bwd {_fmt(row.fb_ms, '.1f')} ms", flush=True)

    # the table
    cols = ["path", "tokens", "mask ms", "ms / forward", "ratio vs (a)", "attn FLOPs vs (a)", "max abs diff"]
    if args.backward:
        cols += ["ms / fwd+bwd", "fwd+bwd ratio vs (a)", "max abs diff grads"]
    cols.append("note")
    print("\n| " + " | ".join(cols) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: | ---: |" if args.backward else "")
          + " --- |")
    bad = []
    for r in rows:
        cells = [r.path, r.tokens, _fmt(r.mask_ms, ".1f", "-"), _fmt(r.fwd_ms, ".1f"),
                 _fmt(None if r.fwd_ms is None else r.fwd_ms / a.fwd_ms, ".3f"), f"{r.flops:.3f}",
                 _fmt(r.diff, ".1e")]
        if args.backward:
            cells += [_fmt(r.fb_ms, ".1f"), _fmt(None if r.fb_ms is None else r.fb_ms / a.fb_ms, ".3f"),
                      _fmt(r.fb_diff, ".1e")]
        cells.append(r.note)
        print("| " + " | ".join(cells) + " |")
        if r.bad:
            bad.append(r.path)
            worst = [a for a in (r.agree, r.fb_agree) if a is not None and not a.ok]
            notes.append(f"{r.path}: max |diff| {worst[0].describe(dtype)}")
    print()
    work_a = dense_causal_work(tokens)
    print(f"(a)'s causal attention work: {attention_gflop(work_a, heads, dim):.1f} GFLOP per layer forward at these "
          f"heads ({attention_gflop(work_a, 16, 128):.1f} at Qwen2.5-3B's 16 x 128); the dense-mask kernel computes "
          f"the whole T^2 square, twice that (the FLOP column counts causal work, T^2/2, for (a)).")
    print(model_flops_line(lengths, packs, tokens))
    for n in notes + flex.notes:
        print(n)
    if bad:
        bound = (f"{ULPS[args.dtype]} {args.dtype} ulps of max |(a)|" if args.dtype in ULPS
                 else f"{TOLERANCE[args.dtype]:g}")
        print(f"BUG: output differs from (a) beyond {bound}: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def gpu_check_rows(device: str, tokens: int, heads: int, kv_heads: int, head_dim: int,
                   pack_cap: int = 8192, reps: int = 3, dtype=None, flex: bool = True) -> list[dict]:
    """The GPU check's attention part (train/gpucheck/kernels.py): (a) a dense mask over the whole pack against (e) the
    presets' packs of at most ``pack_cap`` tokens and (b) compiled flex_attention (``flex``), forward + backward
    where the device allows; rows of {check, value, ok} (ok None: a measurement, not a check). ``dtype``: bf16
    on CUDA, fp32 on CPU unless given; agreement is judged by :func:`agreement` (bf16: ULPS of max |(a)|)."""
    if dtype is None:
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lo, hi = (1000, 4000) if tokens >= 8192 else (max(8, tokens // 10), max(16, tokens // 3))
    cap = pack_cap if tokens > pack_cap else max(hi, tokens // 2)
    lengths = draw_lengths(tokens, lo, hi, 0)
    pos = position_ids_of(lengths, device)
    q, k, v = make_qkv(tokens, heads, kv_heads, head_dim, dtype, device, 0, requires_grad=True)
    grad_out = torch.randn(tokens, heads, head_dim, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    module = _AttnModule(heads, kv_heads, training=True)
    mask = hf_packed_mask("sdpa", pos, heads, kv_heads, head_dim, dtype)
    rows = []
    fa = lambda q_, k_, v_: dense_sdpa(q_, k_, v_, mask, module)  # noqa: E731
    ref, ta = timed(lambda: forward_backward(fa, q, k, v, grad_out), device, 1, reps)
    rows.append({"check": f"(a) dense mask, {tokens:,} tokens, {len(lengths)} seqs: fwd+bwd", "value": f"{ta:.1f} ms",
                 "ok": None})
    packs = first_fit_decreasing(lengths, cap)
    small = SmallPacks.build(lengths, packs, heads, kv_heads, head_dim, dtype, device)
    fe = lambda q_, k_, v_: small(q_, k_, v_, module)  # noqa: E731
    out, te = timed(lambda: forward_backward(fe, q, k, v, grad_out), device, 1, reps)
    agree = agreement(out, ref, dtype)
    rows.append({"check": f"(e) packs <= {cap:,} ({len(packs)}): fwd+bwd time, max |grad diff| vs (a)",
                 "value": f"{te:.1f} ms ({te / ta:.2f} of a), {agree.describe(dtype)}", "ok": agree.ok})
    rows.append({"check": "(e) attention FLOPs vs (a), analytic", "value": f"{flop_ratio('e', lengths, packs):.3f}",
                 "ok": None})
    if not flex:
        return rows
    flex = FlexRunner(compile=True)
    try:
        block = hf_packed_mask("flex_attention", pos, heads, kv_heads, head_dim, dtype)
        fb = lambda q_, k_, v_: flex(q_, k_, v_, block, module)  # noqa: E731
        if device == "cuda":
            out, tb = timed(lambda: forward_backward(fb, q, k, v, grad_out), device, 1, reps)
            what = "fwd+bwd"
            agree = agreement(out, ref, dtype)  # the gradients
        else:  # no flex backward on CPU: the forward, against (a)'s forward
            qd, kd, vd = (t.detach() for t in (q, k, v))
            with torch.no_grad():
                out, tb = timed(lambda: fb(qd, kd, vd), device, 1, reps)
                agree = agreement(out, fa(qd, kd, vd), dtype)
            what = "fwd (no backward on CPU)"
        note = f"; {flex.compile_error}" if flex.compile_error else ""
        rows.append({"check": f"(b) flex_attention, document mask: {what}, max |diff| vs (a)",
                     "value": f"{tb:.1f} ms, {agree.describe(dtype)}{note}", "ok": agree.ok})
    except Exception as e:  # noqa: BLE001  (reported: flex is a candidate, not the presets' path)
        rows.append({"check": "(b) flex_attention",
                     "value": f"not run: {type(e).__name__}: {str(e).splitlines()[0][:100]}",
                     "ok": None})
    return rows


def model_flops_line(lengths: list[int], packs: list[list[int]], tokens: int) -> str:
    """Qwen2.5-3B forward GFLOP per token: the linear layers + lm_head, plus attention as each path does it."""
    m = QWEN25_3B
    kv_dim = m["kv_heads"] * m["head_dim"]
    per_layer = 2 * (2 * m["hidden"] * m["hidden"] + 2 * m["hidden"] * kv_dim + 3 * m["hidden"] * m["intermediate"])
    linear = m["layers"] * per_layer + 2 * m["hidden"] * m["vocab"]

    def attn(work: float) -> float:
        return m["layers"] * 4 * m["heads"] * m["head_dim"] * work / tokens

    dense_full = attn(2 * dense_causal_work(tokens))  # what the dense-mask kernel computes: the whole square
    doc = attn(document_work(lengths))
    small = attn(2 * sum(dense_causal_work(sum(lengths[i] for i in p)) for p in packs))
    g = 1e9
    return (f"Qwen2.5-3B forward per token (analytic): linear layers + lm_head {linear / g:.2f} GFLOP; attention with "
            f"the dense mask at {tokens} (full T^2) {dense_full / g:.2f} -> total {(linear + dense_full) / g:.2f}; in "
            f"the smaller packs (full P^2) {small / g:.2f} -> {(linear + small) / g:.2f} "
            f"({(linear + dense_full) / (linear + small):.2f}x less); document-aware (sum L^2/2) {doc / g:.2f} -> "
            f"{(linear + doc) / g:.2f} ({(linear + dense_full) / (linear + doc):.2f}x less)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per pack (ppo_max_token_len_per_gpu)")
    ap.add_argument("--min-len", type=int, default=1000)
    ap.add_argument("--max-len", type=int, default=4000)
    ap.add_argument("--small-pack", type=int, default=8192, help="(e)'s pack size")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1, help="timed calls per path (best is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backward", action="store_true", help="also time forward + backward")
    ap.add_argument("--paths", default="abcde", help="which of b, c, d, e to run besides (a), e.g. ade")
    ap.add_argument("--flex-eager", action="store_true", help="(b) without torch.compile (unfused, dense)")
    ap.add_argument("--quick", action="store_true",
                    help="a short run: 4,096 tokens, lengths 400-1,200, packs of 2,048, 4 q heads / 1 KV head")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.min_len, args.max_len, args.small_pack = 4096, 400, 1200, 2048
        args.heads, args.kv_heads = 4, 1
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    if not 0 < args.min_len <= args.max_len <= args.small_pack:
        ap.error("need 0 < --min-len <= --max-len <= --small-pack")
    if set(args.paths) - set("abcde"):
        ap.error("--paths takes letters from abcde")
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
