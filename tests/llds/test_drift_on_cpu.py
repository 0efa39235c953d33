"""SAPO's drift penalty (train/llds/drift.py, arXiv 2603.10069) against values computed by hand."""

import math
import re

import pytest
import torch

from train.llds.drift import DriftConfig, drift_penalty
from train.llds.loss import drift_term


def batch():
    """3 responses x 3 action tokens, old probability 0.5 everywhere. Row 0 (A = +1): ratios 1.0, 0.5, 0.9;
    row 1 (A = -1): ratio 0.1 everywhere; row 2 (A = 0): ratios 0.75, 1.2 and a masked token (observation)."""
    old = torch.full((3, 3), math.log(0.5))
    ratios = torch.tensor([[1.0, 0.5, 0.9], [0.1, 0.1, 0.1], [0.75, 1.2, 0.01]])
    new = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3, [0.0] * 3])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    return old, new, adv, mask


def test_the_penalty_by_hand():
    old, new, adv, mask = batch()
    term, penalised, counted = drift_penalty(old, new, adv, mask, threshold=0.8, weight=0.2)
    # counted: the 5 action tokens of rows 0 and 2 (A >= 0; row 1 has A < 0, row 2's third token is masked);
    # penalised: ratio <= 0.8, i.e. row 0's 0.5 and row 2's 0.75: -ln 0.5 = 0.693147, -ln 0.75 = 0.287682
    assert (int(penalised), int(counted)) == (2, 5)
    assert term.item() == pytest.approx(0.2 * (0.693147 + 0.287682) / 5, abs=1e-6)  # 0.0392332
    term.backward()
    expected = torch.zeros(3, 3)
    expected[0, 1] = expected[2, 0] = -0.2 / 5  # d(-w log r / n)/d log pi: raises those tokens' likelihood
    assert torch.allclose(new.grad, expected, atol=1e-7)


def test_nothing_to_penalise_and_the_threshold_edge():
    old, new, adv, mask = batch()
    term, penalised, _ = drift_penalty(old, new.detach(), -adv.abs() - 1, mask)  # every A < 0
    assert term.item() == 0.0 and int(penalised) == 0
    term, penalised, _ = drift_penalty(old, new.detach(), adv, mask, threshold=0.4)  # only ratios <= 0.4
    assert int(penalised) == 0
    term, penalised, _ = drift_penalty(old, new.detach(), adv, mask, threshold=1.0)  # every falling ratio
    assert int(penalised) == 4  # 0.5, 0.9, 0.75 and 1.0 itself (log r = 0 <= 0: counted, adds 0)


def test_micro_batches_add_up_to_the_mini_batch_mean():
    """Two micro-batches with the same share of A >= 0 tokens add up to the penalty of the whole mini-batch
    (verl sums micro-batch losses normalised by the global token count N)."""
    old, new, adv, mask = batch()
    old, new, adv, mask = (torch.cat([t, t]) for t in (old, new.detach(), adv, mask))
    cfg = DriftConfig(enable=True)
    whole, _ = drift_term(old, new, adv, mask, cfg)  # one micro-batch: the plain mean
    n = float(mask.sum())  # N over the mini-batch, one rank
    parts = [drift_term(old[i:i + 3], new[i:i + 3], adv[i:i + 3], mask[i:i + 3], cfg, batch_num_tokens=n)[0]
             for i in (0, 3)]
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=1e-6)


@pytest.mark.parametrize("d, named", [({"weight": -1}, "drift_penalty.weight"), ({"threshold": 1.5}, "threshold"),
                                      ({"tau": 1}, "unknown keys ['tau']"), ({"enable": "yes"}, "enable")])
def test_bad_settings_are_named(d, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        DriftConfig.from_dict(d)
