"""bench/bench_attention.py on a tiny pack: every attention path gives (a)'s output (the dense block-diagonal
mask transformers builds from verl's packed position ids, through SDPA), the analytic FLOP ratios are the
sums of squares they claim, and a wrong document mask is caught (it changes the output)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import bench_attention as ba  # noqa: E402

LENGTHS = [100, 60, 96]  # 3 sequences, 256 tokens; the 128-token flex blocks straddle the sequence borders
HEADS, KV_HEADS, DIM = 2, 1, 16
ATOL = 1e-5


@pytest.fixture(scope="module")
def pack():
    pos = ba.position_ids_of(LENGTHS)
    q, k, v = ba.make_qkv(sum(LENGTHS), HEADS, KV_HEADS, DIM, seed=3)
    module = ba._AttnModule(HEADS, KV_HEADS)
    mask = ba.hf_packed_mask("sdpa", pos, HEADS, KV_HEADS, DIM)
    return pos, q, k, v, module, mask, ba.dense_sdpa(q, k, v, mask, module)


def _reference_by_hand(q, k, v, lengths):
    """Causal softmax attention within each sequence, in float64, written out (no SDPA, no transformers)."""
    outs, start = [], 0
    rep = q.shape[1] // k.shape[1]
    for n in lengths:
        s = slice(start, start + n)
        qs, ks, vs = q[0, :, s].double(), k[0, :, s].double().repeat_interleave(rep, 0), v[0, :, s].double()
        scores = qs @ ks.transpose(-1, -2) / DIM ** 0.5
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        outs.append((scores.softmax(-1) @ vs.repeat_interleave(rep, 0)).transpose(0, 1))
        start += n
    return torch.cat(outs)


def test_the_dense_mask_reference_is_per_sequence_causal_attention(pack):
    pos, q, k, v, module, mask, ref = pack
    assert mask.dtype == torch.bool and mask.shape == (1, 1, 256, 256)
    assert ref.shape == (256, HEADS, DIM)
    torch.testing.assert_close(ref.double(), _reference_by_hand(q, k, v, LENGTHS), rtol=0, atol=ATOL)


@pytest.mark.slow
def test_flex_with_transformers_block_mask_matches_the_dense_mask(pack):
    """transformers' flex path as verl would run it: create_causal_mask -> BlockMask, compiled flex_attention."""
    from torch.nn.attention.flex_attention import BlockMask

    pos, q, k, v, module, mask, ref = pack
    block_mask = ba.hf_packed_mask("flex_attention", pos, HEADS, KV_HEADS, DIM)
    assert isinstance(block_mask, BlockMask)
    flex = ba.FlexRunner(compile=True)
    out = flex(q, k, v, block_mask, module)
    assert flex.compile_error is None, flex.compile_error  # inductor compiles flex on this CPU
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    eager = ba.FlexRunner(compile=False)(q, k, v, block_mask, module)
    torch.testing.assert_close(eager, ref, rtol=0, atol=ATOL)


def test_flex_backward_is_refused_on_cpu(pack):
    pos, q, k, v, module, mask, ref = pack
    block_mask = ba.hf_packed_mask("flex_attention", pos, HEADS, KV_HEADS, DIM)
    qg = q.detach().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        ba.FlexRunner(compile=False)(qg, k, v, block_mask, ba._AttnModule(HEADS, KV_HEADS, training=True))


def test_per_sequence_and_smaller_packs_match_the_dense_mask(pack):
    pos, q, k, v, module, mask, ref = pack
    torch.testing.assert_close(ba.per_sequence(q, k, v, LENGTHS, module), ref, rtol=0, atol=ATOL)
    packs = ba.first_fit_decreasing(LENGTHS, 160)
    assert packs == [[0, 1], [2]]
    small = ba.SmallPacks.build(LENGTHS, packs, HEADS, KV_HEADS, DIM, torch.float32, "cpu")
    torch.testing.assert_close(small(q, k, v, module), ref, rtol=0, atol=ATOL)


def test_gradients_of_the_sdpa_paths_match(pack):
    pos, q, k, v, module, mask, ref = pack
    train = ba._AttnModule(HEADS, KV_HEADS, training=True)
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    g = torch.randn(256, HEADS, DIM, generator=torch.Generator().manual_seed(5))
    want = ba.forward_backward(lambda a, b, c: ba.dense_sdpa(a, b, c, mask, train), qg, kg, vg, g)
    small = ba.SmallPacks.build(LENGTHS, [[0, 2], [1]], HEADS, KV_HEADS, DIM, torch.float32, "cpu")
    for fn in (lambda a, b, c: ba.per_sequence(a, b, c, LENGTHS, train), lambda a, b, c: small(a, b, c, train)):
        got = ba.forward_backward(fn, qg, kg, vg, g)
        assert ba.max_abs_diff(got, want) < ATOL


def test_a_wrong_document_mask_is_caught(pack):
    """Negative controls: masks that ignore the sequence borders give other outputs, far beyond ATOL."""
    from torch.nn.attention.flex_attention import create_block_mask

    pos, q, k, v, module, mask, ref = pack
    causal_only = ba.hf_packed_mask("sdpa", torch.arange(256)[None], HEADS, KV_HEADS, DIM)  # one sequence
    assert ba.max_abs_diff(ba.dense_sdpa(q, k, v, causal_only, module), ref) > 1e-2
    doc = torch.tensor([0] * 100 + [1] * 156)  # the last two sequences merged
    wrong = create_block_mask(lambda b, h, i, j: (i >= j) & (doc[i] == doc[j]), 1, None, 256, 256, device="cpu")
    assert ba.max_abs_diff(ba.FlexRunner(compile=False)(q, k, v, wrong, module), ref) > 1e-2
    assert ba.max_abs_diff(ba.per_sequence(q, k, v, [100, 156], module), ref) > 1e-2


def test_varlen_is_reported_unavailable_without_a_cuda_kernel(pack):
    pos, q, k, v, module, mask, ref = pack
    if torch.cuda.is_available():
        pytest.skip("CPU check")
    with pytest.raises(ba.Unavailable):
        ba.varlen(q, k, v, LENGTHS)


def test_analytic_flop_ratios():
    total = 256 * 256 / 2
    assert ba.dense_causal_work(256) == total
    assert ba.flop_ratio("a", LENGTHS) == 1.0
    doc = (100 ** 2 + 60 ** 2 + 96 ** 2) / 256 ** 2
    for path in "bcd":
        assert ba.flop_ratio(path, LENGTHS) == pytest.approx(doc, rel=1e-12)
    assert ba.flop_ratio("e", LENGTHS, [[0, 1], [2]]) == pytest.approx((160 ** 2 + 96 ** 2) / 256 ** 2, rel=1e-12)
    assert ba.attention_gflop(total, 16, 128) == pytest.approx(4 * 16 * 128 * total / 1e9)


def test_pack_building():
    lengths = ba.draw_lengths(16384, 1000, 4000, seed=0)
    assert sum(lengths) == 16384 and all(n <= 4000 for n in lengths) and all(n >= 1000 for n in lengths[:-1])
    assert lengths == ba.draw_lengths(16384, 1000, 4000, seed=0)
    packs = ba.first_fit_decreasing(lengths, 8192)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= 8192 for p in packs)
    pos = ba.position_ids_of([3, 2])
    assert pos.tolist() == [[0, 1, 2, 0, 1]]
    with pytest.raises(ValueError):
        ba.first_fit_decreasing([5000], 4096)
