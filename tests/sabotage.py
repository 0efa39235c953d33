"""Broken policy losses for the learning test's negative checks (loaded with SEARCH_R1_PLUGINS).

``sabotage_flipped``: verl's vanilla PPO loss with the advantage sign flipped (the policy is pushed
away from what the reward favours). ``sabotage_zero``: the vanilla loss times zero (no policy
gradient; the KL and LLDS terms stay). A pipeline that learns with ``vanilla`` must not with these.
``sabotage_unlikely``: the policy-gradient loss with every response token's advantage set to -1, whatever the
reward, and no clip: each update lowers the likelihood of what the policy just sampled, the displacement LLD
describes made extreme. Unlike ``sabotage_flipped``, whose push ends once every reward is 0 (GRPO's
advantages are then 0), it goes on every step, so it is the positive control for the collapse warning (it
must raise the ALARM).
"""

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, register_policy_loss


@register_policy_loss("sabotage_flipped")
def flipped(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
            rollout_is_weights=None):
    return compute_policy_loss_vanilla(old_log_prob, log_prob, -advantages, response_mask, loss_agg_mode,
                                       config, rollout_is_weights)


@register_policy_loss("sabotage_unlikely")
def unlikely(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
    # -A * ratio with A = -1 on every token and no clip: PPO's clip would stop the push on a token once its
    # ratio fell below 1 - clip_ratio (0.8), which bounds what one step can displace to about 0.22 nats
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    pg_loss = agg_loss(loss_mat=torch.exp(negative_approx_kl), loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                       **config.global_batch_info)
    return pg_loss, {"actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0,
                     "actor/ppo_kl": verl_F.masked_mean(-negative_approx_kl, response_mask).detach().item()}


@register_policy_loss("sabotage_zero")
def zero(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
         rollout_is_weights=None):
    loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                                                config, rollout_is_weights)
    return loss * 0.0, metrics
