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


# -- bf16: the tolerance follows the magnitude -------------------------------------------------------------

BF16_ARGS = ["--dtype", "bf16", "--tokens", "1024", "--min-len", "100", "--max-len", "340", "--small-pack", "512",
             "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--paths", "ade", "--backward"]


def test_the_bf16_tolerance_is_units_in_the_last_place_of_the_magnitude_and_fp32_stays_absolute():
    bf16 = torch.bfloat16
    assert ba.ulp(14.0, bf16) == 2 ** -4 and ba.ulp(6.0, bf16) == 2 ** -5 and ba.ulp(1.0, bf16) == 2 ** -7
    big = torch.tensor([14.0, -3.0, 0.5], dtype=bf16)
    assert ba.tolerance(big, bf16) == ba.ULPS["bf16"] * 2 ** -4  # 8 ulps at 14: 0.5
    assert ba.tolerance(big.float() * 1000, torch.float32) == ba.TOLERANCE["fp32"] == 1e-4  # fp32: tight, absolute
    # one ulp of rounding on the largest value (0.0625 > the old absolute 3e-2) is fine ...
    assert ba.agreement(big + torch.tensor([2 ** -4, 0, 0], dtype=bf16), big, bf16).ok
    # ... a difference of the values' size is not, and each tensor is held to its own magnitude: a small
    # gradient (max 0.5) may not hide a wrong value behind a large one (max 14)
    assert not ba.agreement(big * 0.5, big, bf16).ok
    small = torch.tensor([0.5, 0.25], dtype=bf16)
    assert ba.agreement((big, small + 0.1), (big, small), bf16).ok is False
    assert ba.agreement((big, small), (big, small), bf16).ok
    # fp32: 1e-3 off is a mismatch however large the values
    ref = torch.full((4,), 1000.0)
    assert not ba.agreement(ref + 1e-3, ref, torch.float32).ok


def test_bf16_paths_pass_on_rounding_alone_and_a_wrong_mask_still_fails(monkeypatch, capsys):
    """bf16 on CPU at 1,024 tokens: the gradients (max |dv| ~6) of (d) and (e) differ from (a)'s by 1-2 bf16 ulps
    (6e-2, over the old absolute 3e-2, which failed here with "BUG"); with the tolerance relative to the magnitude
    the run passes, and a per-sequence path with the last two sequences merged (a wrong document mask) fails."""
    assert ba.main(BF16_ARGS) == 0, capsys.readouterr()
    capsys.readouterr()
    real = ba.per_sequence

    def merged_borders(q, k, v, lengths, module):
        return real(q, k, v, lengths[:-2] + [lengths[-2] + lengths[-1]], module)

    monkeypatch.setattr(ba, "per_sequence", merged_borders)
    assert ba.main(BF16_ARGS) == 1
    err = capsys.readouterr().err
    assert "BUG" in err and "(d) SDPA per sequence" in err and "(e)" not in err


def test_gpu_check_rows_in_bf16_pass_and_catch_a_pack_mask_that_ignores_the_borders(monkeypatch):
    """The GPU check's attention rows in bf16 (as on CUDA), on CPU without flex: (e) agrees with (a); with each
    small pack's mask built as one causal sequence (the sequences of a pack see each other) it does not."""
    rows = ba.gpu_check_rows("cpu", 1024, 4, 2, 32, reps=1, dtype=torch.bfloat16, flex=False)
    (e,) = [r for r in rows if r["check"].startswith("(e) packs")]
    assert e["ok"] is True and "bf16 ulps of max |ref|" in e["value"], e
    real = ba.SmallPacks.build.__func__

    def borders_ignored(cls, lengths, packs, heads, kv_heads, head_dim, dtype, device):
        small = real(cls, lengths, packs, heads, kv_heads, head_dim, dtype, device)
        small.masks = [ba.hf_packed_mask("sdpa", torch.arange(len(i))[None], heads, kv_heads, head_dim, dtype)
                       for i in small.index]
        return small

    monkeypatch.setattr(ba.SmallPacks, "build", classmethod(borders_ignored))
    rows = ba.gpu_check_rows("cpu", 1024, 4, 2, 32, reps=1, dtype=torch.bfloat16, flex=False)
    (e,) = [r for r in rows if r["check"].startswith("(e) packs")]
    assert e["ok"] is False and ">" in e["value"], e
