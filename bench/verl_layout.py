"""Build actor micro-batches exactly as verl 0.9.1 lays them out (DataProto -> TensorDict ->
no-padding), and the jagged log-probs its engine hands to the loss. Used by ``bench/bench_llds.py`` and
by the LLDS loss tests (``tests/llds/test_loss_on_cpu.py``), which import it from here: bench/ never
imports tests/."""

from __future__ import annotations

import torch


def actor_config(**overrides):
    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass

    ov = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
          "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
          "actor_rollout_ref.actor.use_kl_loss": True,
          "actor_rollout_ref.actor.kl_loss_coef": 0.001,
          "actor_rollout_ref.actor.entropy_coeff": 0.001}
    ov.update(overrides)
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"{k}={v}" for k, v in ov.items()])
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def make_batch(B=4, P=6, R=10, vocab=1000, seed=0):
    """Left-padded prompts, right-padded responses with an observation gap; mixed advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = [P - (i % 3) for i in range(B)]
    resp_lens = [R - (i % 4) for i in range(B)]
    prompts = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    answer_mask = torch.zeros(B, R, dtype=torch.long)
    for i in range(B):
        pl, rl = prompt_lens[i], resp_lens[i]
        prompts[i, P - pl:] = torch.randint(3, vocab, (pl,), generator=g)
        responses[i, :rl] = torch.randint(3, vocab, (rl,), generator=g)
        attn[i, P - pl: P + rl] = 1
        response_mask[i, :rl] = 1
        response_mask[i, 2:4] = 0  # an observation
        answer_mask[i, rl - 2: rl] = 1
    position_ids = (torch.cumsum(attn, -1) - 1).clamp(min=0)
    adv = torch.tensor([1.0, -1.0, 0.0, 0.5]).repeat(B // 4 + 1)[:B].repeat_interleave(R).view(B, R) * response_mask
    return {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attn, "position_ids": position_ids, "response_mask": response_mask,
        "advantages": adv, "answer_mask": answer_mask,
    }


def to_micro_batches(tensors: dict, n_micro: int, batch_num_tokens: int, dp_size: int = 1):
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    dp = DataProto.from_dict(tensors={k: v.clone() for k, v in tensors.items()})
    out = []
    for chunk in dp.chunk(n_micro):
        td = left_right_2_no_padding(chunk.to_tensordict())
        tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=batch_num_tokens,
                             global_batch_size=len(dp))
        out.append(td)
    return out


def jagged_log_probs(model, td):
    """Per-sequence next-token log-probs, jagged like the engine's output (position j scores j+1)."""
    ids = td["input_ids"]
    values = []
    for seq in ids.unbind():
        logits = model(input_ids=seq.unsqueeze(0)).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        nxt = torch.roll(seq, -1)
        values.append(lp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
    flat = torch.cat(values)
    return torch.nested.nested_tensor_from_jagged(flat, offsets=ids.offsets())


def padded_response_log_probs(model, tensors):
    """[B, R] log-probs of the response tokens (what compute_log_prob gives as old_log_probs)."""
    with torch.no_grad():
        td = to_micro_batches(tensors, 1, int(tensors["response_mask"].sum()))[0]
        from verl.workers.utils.padding import no_padding_2_padding

        return no_padding_2_padding(jagged_log_probs(model, td), td)
