"""Per-token log-probabilities from logits, vectorised in chunks: what verl runs without flash-attn.

verl 0.9.1's ``logprobs_from_logits`` uses flash-attn's Triton cross-entropy when flash-attn is
importable; without it (no binary wheel on PyPI: our GPU install) it falls back to
``logprobs_from_logits_v2``, a Python loop over the rows of the packed ``(tokens, vocab)`` logits:
one ``logsumexp`` per token (fp32) or one ``log_softmax`` + ``gather`` per token (bf16), i.e. up to
16,384 small kernels per micro-batch in the old-log-prob, reference and update passes, and as many
autograd nodes in the backward. The bf16 branch also keeps every row's log-softmax (the size of the
logits) for the backward.

:func:`chunked_logprobs` computes the same ``logit[label] - logsumexp(logits)`` over chunks of rows
(a few hundred rows at a time on GPUs, a few on CPU; upcast to fp32 within the chunk), with a hand-written backward
(``grad = g * (onehot(label) - softmax)``, chunk by chunk into one gradient buffer), so it saves
only the per-row log-sum-exp for the backward, like flash-attn's kernel, and returns fp32 as that
kernel does. Temperature is applied by verl before the call (``logits / T``); the entropy is a
separate, already vectorised function (``entropy_from_logits``), and LLDS reads the per-token
log-probs this returns. ``bench/bench_logprobs.py`` measures it against verl's loop.

:func:`install` (called by the ``verl.plugins`` entry point, so in every verl process) puts it in
place of verl's dispatcher before verl's engines import it; flash-attn and NPU kernels, when present,
are still used.
"""

from __future__ import annotations

import torch

#: logits per chunk on accelerators: 2**26 fp32 values = 256 MiB of temporaries (441 rows at Qwen2.5's 151,936
#: vocabulary: 38 chunks for 16,384 tokens); on CPU 2**20 (4 MiB, a few rows: cache-sized; measured fastest
#: of 2**17-2**26 on the 2-core machine, bench/RESULTS.md)
MAX_ELEMS = 1 << 26
MAX_ELEMS_CPU = 1 << 20


def _rows(vocab: int, max_elems: int) -> int:
    return max(1, max_elems // max(vocab, 1))


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, max_elems: int):
        rows = _rows(logits.shape[-1], max_elems)
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for lo in range(0, logits.shape[0], rows):
            lse[lo: lo + rows] = torch.logsumexp(logits[lo: lo + rows].float(), dim=-1)
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        ctx.save_for_backward(logits, labels, lse)
        ctx.max_elems = max_elems
        return picked - lse

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        rows = _rows(logits.shape[-1], ctx.max_elems)
        grad = torch.empty_like(logits)
        g = grad_out.float()
        same = logits.dtype == torch.float32
        for lo in range(0, logits.shape[0], rows):
            hi = min(lo + rows, logits.shape[0])
            # d logp[label] / d logit_j = [j == label] - softmax_j; in place in fp32 (the gradient buffer itself)
            chunk = torch.sub(logits[lo:hi].float(), lse[lo:hi, None], out=grad[lo:hi] if same else None)
            chunk.exp_().mul_(-g[lo:hi, None]).scatter_add_(-1, labels[lo:hi, None], g[lo:hi, None])
            if not same:
                grad[lo:hi] = chunk
        return grad, None, None


def chunked_logprobs(logits: torch.Tensor, labels: torch.Tensor, max_elems: int | None = None) -> torch.Tensor:
    """``log_softmax(logits)[..., label]`` in fp32, shape ``logits.shape[:-1]``; any leading shape."""
    if max_elems is None:
        max_elems = MAX_ELEMS_CPU if logits.device.type == "cpu" else MAX_ELEMS
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    lead = logits.shape[:-1]
    flat = _ChunkedLogprobs.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), max_elems)
    return flat.view(lead)


def install() -> None:
    """Use :func:`chunked_logprobs` where verl would loop over tokens (idempotent)."""
    import os

    import verl.utils.torch_functional as verl_F

    if getattr(verl_F.logprobs_from_logits, "_search_r1", False):
        return
    original = verl_F.logprobs_from_logits

    def logprobs_from_logits(logits, labels, inplace_backward=True):
        flash = (verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE
                 and os.environ.get("VERL_DISABLE_FLASH_ATTN_CE", "0") != "1")
        if flash or verl_F.NPU_CROSS_ENTROPY_LOSS_AVAILABLE:
            return original(logits, labels, inplace_backward=inplace_backward)
        return chunked_logprobs(logits, labels)

    logprobs_from_logits._search_r1 = True
    logprobs_from_logits.__doc__ = chunked_logprobs.__doc__
    verl_F.logprobs_from_logits = logprobs_from_logits
    import sys

    for name in ("verl.workers.engine.fsdp.transformer_impl",):  # imported before this ran (bound by name)
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "logprobs_from_logits"):
            module.logprobs_from_logits = logprobs_from_logits
