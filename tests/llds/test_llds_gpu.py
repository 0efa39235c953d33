"""GPU-only: the LLDS penalty on CUDA at real sizes equals the CPU result (skipped without CUDA)."""

import pytest
import torch

from train.llds.penalty import llds_token_penalty


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_llds_cuda_matches_cpu_at_real_size(gate):
    g = torch.Generator().manual_seed(0)
    B, T = 64, 4096
    old = -torch.rand(B, T, generator=g) * 3
    new = old + 0.05 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    mask = (torch.rand(B, T, generator=g) > 0.2).long()
    cpu = llds_token_penalty(old, new, adv, mask, gate=gate)
    gpu = llds_token_penalty(old.cuda(), new.cuda(), adv.cuda(), mask.cuda(), gate=gate).cpu()
    torch.testing.assert_close(gpu, cpu)
