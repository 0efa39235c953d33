"""The patched actor loss through verl's own ppo_loss, laid out as verl lays it out."""

import pytest
import torch

from bench.verl_layout import actor_config, jagged_log_probs, make_batch, padded_response_log_probs, to_micro_batches
from train.llds.loss import LLDSConfig, llds_ppo_loss, make_actor_loss


@pytest.fixture(scope="module")
def cfg():
    return actor_config()


@pytest.fixture()
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)


def _batch(model, shift=0.3):
    t = make_batch(vocab=model.config.vocab_size)
    lp = padded_response_log_probs(model, t)
    g = torch.Generator().manual_seed(1)
    # old policy differs from the current one: some likelihoods fell, some rose
    t["old_log_probs"] = lp + shift * torch.randn(lp.shape, generator=g)
    t["ref_log_prob"] = lp.clone()
    return t


def _grads(model, cfg, t, n_micro, llds):
    model.zero_grad()
    n_tok = int(t["response_mask"].sum())
    total = 0.0
    for td in to_micro_batches(t, n_micro, n_tok):
        out = {"log_probs": jagged_log_probs(model, td)}
        loss, metrics = llds_ppo_loss(cfg, out, td, llds=llds)
        loss.backward()
        total += float(loss)
    return total, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).clone(), metrics


def test_equals_verl_loss_plus_llds_term(cfg, model):
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    from train.llds.penalty import llds_token_penalty

    t = _batch(model)
    td = to_micro_batches(t, 1, int(t["response_mask"].sum()))[0]
    out = {"log_probs": jagged_log_probs(model, td)}
    base, _ = ppo_loss(cfg, out, td)
    ours, metrics = llds_ppo_loss(cfg, out, td, llds=LLDSConfig(lam=0.2))
    lp = no_padding_2_padding(out["log_probs"], td)
    pen = llds_token_penalty(t["old_log_probs"], lp, t["advantages"], t["response_mask"])
    expected = base + 0.2 * pen.sum() / t["response_mask"].sum()
    assert float(ours.detach()) == pytest.approx(float(expected.detach()), rel=1e-6)
    assert float(pen.detach().sum()) > 0
    assert "llds/penalty" in metrics and "actor/pg_loss" in metrics and "kl_loss" in metrics
    off, off_metrics = llds_ppo_loss(cfg, out, td, llds=LLDSConfig(enable=False))
    assert float(off) == pytest.approx(float(base))
    # LLDS off: verl's loss unchanged, but the LLD diagnostics (the collapse alarm's signal) still logged
    assert "llds/penalty" not in off_metrics
    raw = sorted(k for k in off_metrics if k.startswith("llds_raw/"))
    assert raw == sorted(k for k in metrics if k.startswith("llds_raw/")) and raw


@pytest.mark.parametrize("gate", ["action", "response", "token"])
def test_micro_batch_invariance(cfg, model, gate):
    t = _batch(model)
    llds = LLDSConfig(lam=0.2, gate=gate, answer_weight=0.5)
    l1, g1, _ = _grads(model, cfg, t, 1, llds)
    l4, g4, _ = _grads(model, cfg, t, 4, llds)
    assert l1 == pytest.approx(l4, abs=1e-6)
    assert torch.allclose(g1, g4, atol=1e-6), float((g1 - g4).abs().max())


def test_adaptive_answer_weight_reads_batch(cfg, model):
    t = _batch(model)
    t["batch_valid_searches"] = torch.full((4,), 1.0)
    td = to_micro_batches(t, 1, int(t["response_mask"].sum()))[0]
    _, m = llds_ppo_loss(cfg, {"log_probs": jagged_log_probs(model, td)}, td,
                         llds=LLDSConfig(answer_weight="adaptive"))
    assert m["llds/answer_weight"] == 0.5  # paper rule: min(1 / 2, 1)
    t.pop("batch_valid_searches")
    td = to_micro_batches(t, 1, int(t["response_mask"].sum()))[0]
    with pytest.raises(ValueError, match="batch_valid_searches"):
        llds_ppo_loss(cfg, {"log_probs": jagged_log_probs(model, td)}, td, llds=LLDSConfig(answer_weight="adaptive"))


def test_zero_on_first_update_active_after(cfg, model):
    """old == current right after rollout -> LLDS is exactly 0; after one optimizer step it is not."""
    t = _batch(model, shift=0.0)
    # Lazy likelihood displacement in miniature: a wrong response (advantage -1) shares its tokens
    # with a barely-right one (advantage +0.1); pushing the wrong one down drags the right one down.
    rl = int(t["response_mask"][1].sum()) + 2
    t["responses"][1, :rl] = t["responses"][0, :rl]
    t["input_ids"] = torch.cat([t["prompts"], t["responses"]], 1)
    t["advantages"][0] = 0.1 * (t["advantages"][0] != 0)
    t["old_log_probs"] = padded_response_log_probs(model, t)
    t["ref_log_prob"] = t["old_log_probs"].clone()
    n_tok = int(t["response_mask"].sum())
    llds = LLDSConfig(lam=0.2, gate="token")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    penalties = []
    for _ in range(2):
        opt.zero_grad()
        td = to_micro_batches(t, 1, n_tok)[0]
        loss, m = llds_ppo_loss(cfg, {"log_probs": jagged_log_probs(model, td)}, td, llds=llds)
        penalties.append(float(m["llds/penalty"].aggregate()))
        loss.backward()
        opt.step()
    assert penalties[0] == 0.0
    assert penalties[1] > 0.0


def test_config_validation_and_partial(cfg):
    with pytest.raises(ValueError, match="gate"):
        LLDSConfig.from_dict({"gate": "chunk"})
    with pytest.raises(ValueError, match="unknown"):
        LLDSConfig.from_dict({"lamda": 0.2})
    with pytest.raises(ValueError, match="answer_weight"):
        LLDSConfig.from_dict({"answer_weight": "big"})
    c = LLDSConfig.from_dict({"lambda": 0.3, "gate": "response"})
    assert c.lam == 0.3
    import pickle

    fn = pickle.loads(pickle.dumps(make_actor_loss(cfg, c)))  # travels to Ray workers
    assert fn.keywords["llds"].lam == 0.3


def _gather_like_verl(per_rank_micro_metrics):
    """verl's path for one mini-batch: each rank append_to_dict's its micro-batch metrics, the dicts
    are all-gathered (allgather_dict_into_dict), then every Metric list goes through aggregate_dp."""
    from verl.utils.metric import Metric
    from verl.utils.py_functional import append_to_dict

    gathered = {}
    for micro in per_rank_micro_metrics:
        rank = {}
        for m in micro:
            append_to_dict(rank, m)
        for k, v in rank.items():
            gathered.setdefault(k, []).append(v)
    return {k: Metric.aggregate_dp(v) if isinstance(v[0], Metric) else v for k, v in gathered.items()}


def test_metrics_same_keys_on_every_rank_and_exact_ratios(cfg, model):
    """2 ranks x 2 micro-batches whose rows have different numbers of positive-advantage actions:
    verl's aggregation must accept the metrics (it raises on a key seen a different number of times
    on different ranks) and the per-step ratios must equal those of the whole batch."""
    from verl.workers.utils.padding import no_padding_2_padding

    from train.llds.loss import finish_llds_metrics
    from train.llds.penalty import llds_stats, merge_stats

    t = _batch(model)
    B, R = t["response_mask"].shape
    # row 0: 3 actions, row 1: 2 actions; rows 2-3 keep one gap; advantage signs differ per row
    t["response_mask"][0, 6:7] = 0
    t["response_mask"][1] = 1
    t["response_mask"][1, 5:6] = 0
    t["response_mask"][1, R - 2:] = 0
    t["attention_mask"][1, -2:] = 0
    t["advantages"] = torch.tensor([1.0, 0.5, -1.0, 2.0]).view(B, 1) * t["response_mask"]
    t["answer_mask"] = t["answer_mask"] * t["response_mask"]
    n_tok = int(t["response_mask"].sum())
    micro = to_micro_batches(t, 4, n_tok, dp_size=2)  # rank 0: rows 0, 1; rank 1: rows 2, 3
    loss_fn = make_actor_loss(cfg, LLDSConfig(lam=0.2), positions=4)
    per_rank = [[], []]
    lps = []
    for i, td in enumerate(micro):
        out = {"log_probs": jagged_log_probs(model, td)}
        lps.append(no_padding_2_padding(out["log_probs"], td).detach())
        _, metrics = loss_fn(model_output=out, data=td)
        per_rank[i // 2].append(metrics)
    step = {f"actor/{k}": [v] for k, v in _gather_like_verl(per_rank).items()}  # one mini-batch
    finish_llds_metrics(step)
    assert not any("llds_raw" in k for k in step)
    whole_lp = padded_response_log_probs(model, t)
    expected = merge_stats([llds_stats(t["old_log_probs"], whole_lp, t["advantages"], t["response_mask"],
                                       answer_mask=t["answer_mask"], positions=4)])
    for k, v in expected.items():
        assert step[f"actor/{k}"] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert expected["llds/logp_pos_a3"] != 0 and expected["llds/logp_pos_a4"] == 0
