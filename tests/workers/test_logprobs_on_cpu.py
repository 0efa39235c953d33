"""The chunked log-prob kernel that replaces verl's per-token loop (train/workers/logprobs.py): same values and
gradients as verl's own fallback, any chunking, and in place on verl's engine path."""

from __future__ import annotations

import pytest
import torch

from train.workers.logprobs import chunked_logprobs


def _inputs(n=300, vocab=5000, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3)
    labels = torch.randint(0, vocab, (n,), generator=g)
    return logits.to(dtype).requires_grad_(), labels


@pytest.mark.parametrize("max_elems", [1, 5000 * 7, 1 << 26])  # a row per chunk, 7 rows, everything at once
def test_fp32_equals_verl_within_1e5_values_and_gradients(max_elems):
    from verl.utils.torch_functional import logprobs_from_logits_v2

    x, y = _inputs()
    ours = chunked_logprobs(x, y, max_elems=max_elems)
    verl = logprobs_from_logits_v2(x, y)
    assert ours.dtype == torch.float32 and ours.shape == (300,)
    torch.testing.assert_close(ours, verl, rtol=0, atol=1e-5)
    g = torch.randn(300, generator=torch.Generator().manual_seed(1))
    (ga,) = torch.autograd.grad(ours, x, g)
    (gb,) = torch.autograd.grad(verl, x, g)
    torch.testing.assert_close(ga, gb, rtol=0, atol=1e-5)


def test_bf16_is_at_least_as_exact_as_verls_bf16_loop():
    """verl's bf16 branch takes log_softmax in bf16; ours accumulates in fp32 (as flash-attn's kernel)."""
    from verl.utils.torch_functional import logprobs_from_logits_v2

    x, y = _inputs(dtype=torch.bfloat16)
    truth = torch.log_softmax(x.detach().double(), -1).gather(-1, y[:, None]).squeeze(-1)
    ours, verl = chunked_logprobs(x, y), logprobs_from_logits_v2(x, y)
    err_ours, err_verl = (ours.double() - truth).abs().max(), (verl.double() - truth).abs().max()
    assert err_ours <= err_verl and err_ours < 1e-4
    (grad,) = torch.autograd.grad(ours.sum(), x)
    want = (torch.nn.functional.one_hot(y, 5000) - torch.softmax(x.detach().double(), -1))
    assert grad.dtype == torch.bfloat16 and (grad.double() - want).abs().max() < 1e-2


def test_leading_shape_and_bad_input():
    x, y = _inputs(n=12)
    out = chunked_logprobs(x.detach().view(3, 4, 5000), y.view(3, 4))
    torch.testing.assert_close(out.view(12), chunked_logprobs(x.detach(), y))
    with pytest.raises(ValueError, match="do not match"):
        chunked_logprobs(x, y[:5])


def test_engine_uses_it_without_flash_attn():
    """On our path (no flash-attn) verl's FSDP engine calls the chunked kernel; its result equals verl's."""
    import verl.utils.torch_functional as F
    import verl.workers.engine.fsdp.transformer_impl as engine

    import train.plugin  # noqa: F401  (what `import verl` loads in every process)

    assert not F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE
    assert engine.logprobs_from_logits is F.logprobs_from_logits and F.logprobs_from_logits._search_r1
    x, y = _inputs(n=64)
    torch.testing.assert_close(engine.logprobs_from_logits(x, y), F.logprobs_from_logits_v2(x, y), rtol=0, atol=1e-5)
