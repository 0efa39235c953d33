"""LLDS math on hand-worked cases (pure torch, no verl)."""


import pytest
import torch

from train.llds.penalty import action_ids, adaptive_answer_weight, llds_stats, llds_token_penalty, merge_stats

T = torch.tensor


def pen(old, new, adv, mask, **kw):
    return llds_token_penalty(T([old]), T([new]), T([adv]), T([mask]), **kw)[0]


def test_action_ids_runs_per_row():
    m = T([[1, 1, 0, 1, 0], [1, 0, 0, 1, 1]]).bool()
    assert action_ids(m).tolist() == [[1, 1, 0, 2, 0], [3, 0, 0, 4, 4]]


def test_action_gate_hand_worked():
    # Two actions separated by an observation (mask 0). d = old - new.
    # action 1: d = [+0.5, -1.0] -> sum -0.5 <= 0 -> closed, even though token 0 decreased.
    # action 2: d = [+0.3, -0.1] -> sum +0.2 > 0 -> open, only the +0.3 token is penalised.
    old = [0.0, 0.0, 0.0, 0.0, 0.0]
    new = [-0.5, 1.0, 9.9, -0.3, 0.1]
    mask = [1, 1, 0, 1, 1]
    p = pen(old, new, [1.0] * 5, mask, gate="action")
    assert p.tolist() == pytest.approx([0.0, 0.0, 0.0, 0.3, 0.0])
    # response gate: sum over preserved tokens = 0.5 - 1.0 + 0.3 - 0.1 = -0.3 -> closed everywhere
    assert pen(old, new, [1.0] * 5, mask, gate="response").tolist() == [0.0] * 5
    # token gate: max(0, d) on every preserved token
    assert pen(old, new, [1.0] * 5, mask, gate="token").tolist() == pytest.approx([0.5, 0.0, 0.0, 0.3, 0.0])


def test_response_gate_opens_on_positive_sum():
    p = pen([0.0, 0.0, 0.0], [-1.0, 0.5, 0.0], [0.0] * 3, [1, 1, 1], gate="response")
    assert p.tolist() == pytest.approx([1.0, 0.0, 0.0])  # advantage 0 is preserved too


def test_negative_advantages_empty_mask_and_zero_d():
    assert pen([0.0] * 3, [-1.0] * 3, [-0.5] * 3, [1, 1, 1], gate="token").tolist() == [0.0] * 3
    assert pen([0.0] * 3, [-1.0] * 3, [1.0] * 3, [0, 0, 0]).tolist() == [0.0] * 3
    assert pen([-2.0] * 3, [-2.0] * 3, [1.0] * 3, [1, 1, 1], gate="token").tolist() == [0.0] * 3
    empty = llds_token_penalty(torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4), torch.zeros(0, 4))
    assert empty.shape == (0, 4)


def test_answer_weight_applies_on_answer_span():
    p = llds_token_penalty(T([[0.0, 0.0, 0.0]]), T([[-1.0, -1.0, -1.0]]), T([[1.0] * 3]), T([[1, 1, 1]]),
                           answer_mask=T([[0, 1, 1]]), answer_weight=0.25)
    assert p[0].tolist() == pytest.approx([1.0, 0.25, 0.25])


def test_gradient_only_on_penalised_tokens():
    old = T([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    new = T([[-0.5, 0.2, -0.1, -0.4], [-0.3, -0.3, -0.3, -0.3]]).requires_grad_()
    adv = T([[1.0] * 4, [-1.0] * 4])
    mask = T([[1, 1, 0, 1], [1, 1, 1, 1]])
    p = llds_token_penalty(old, new, adv, mask)
    p.sum().backward()
    # row 0: action [0,1] sum 0.5-0.2 = 0.3 > 0 -> token 0 penalised (d>0), token 1 not (d<0);
    # token 2 is an observation; action [3] d = 0.4 -> penalised. row 1: negative advantage.
    assert new.grad.tolist() == [[-1.0, 0.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]


def test_non_finite_inputs_stay_on_their_row():
    old = T([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0], [float("inf"), 0.0, 0.0]])
    new = T([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, float("-inf"), 0.0]])
    adv = T([[1.0] * 3, [1.0] * 3, [1.0] * 3])
    mask = T([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
    for gate in ("action", "response", "token"):
        p = llds_token_penalty(old, new, adv, mask, gate=gate)
        assert p[1].tolist() == [1.0, 1.0, 1.0], gate
    # NaN inside a masked-out position changes nothing
    p = llds_token_penalty(T([[0.0, float("nan")]]), T([[-1.0, 0.0]]), T([[1.0, 1.0]]), T([[1, 0]]))
    assert p.tolist() == [[1.0, 0.0]]


def test_shape_and_gate_errors():
    with pytest.raises(ValueError, match="gate"):
        llds_token_penalty(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), gate="x")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        llds_token_penalty(torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 2))


def test_stats_and_adaptive_weight():
    old = T([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    new = T([[-0.5, 0.2, -1.0, -2.0], [-0.3, -0.3, -0.3, -0.3]])
    adv = T([[1.0] * 4, [-1.0] * 4])
    mask = T([[1, 1, 0, 1], [1, 1, 1, 1]])
    s = merge_stats([llds_stats(old, new, adv, mask, answer_mask=T([[0, 0, 0, 1], [0, 0, 0, 0]]))])
    assert s["llds/gated_action_frac"] == 1.0  # both actions of row 0 have a positive sum
    assert s["llds/gated_response_frac"] == 1.0
    assert s["llds/d_mean_preserved"] == pytest.approx((0.5 - 0.2 + 2.0) / 3)
    assert s["llds/d_mean_negative"] == pytest.approx(0.3)
    assert s["llds/logp_pos_a1"] == pytest.approx((-0.5 + 0.2) / 2)
    assert s["llds/logp_pos_a2"] == pytest.approx(-2.0)
    assert s["llds/logp_pos_answer"] == pytest.approx(-2.0)
    assert adaptive_answer_weight(1.0, "paper") == 0.5
    assert adaptive_answer_weight(5.0, "paper") == 1.0
    assert adaptive_answer_weight(1.0, "released") == 0.0
    assert adaptive_answer_weight(1.5, "released") == pytest.approx(0.5)
    assert adaptive_answer_weight(3.0, "released") == 1.0
    with pytest.raises(ValueError):
        adaptive_answer_weight(1.0, "other")
