"""Advantage stage: outcome advantages per group (GRPO, RLOO, Dr. GRPO, ...)
or GAE over the value head's predictions (PPO), with the KL-to-reference
folded into the reward when the objective places it there."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxrl_llm import objectives as obj_lib


def advantages(reward_B: np.ndarray, keep_B: np.ndarray, mask_BR: np.ndarray, obj: obj_lib.ObjectiveConfig,
               group_size: int, *, prox_logp_BR=None, ref_logp_BR=None, values_BR=None):
  """-> (adv_BR, returns_BR) as host f32 arrays; rows with keep=False get 0."""
  reward = jnp.asarray(reward_B)
  mask = jnp.asarray(mask_BR)
  kl_in_reward = obj.kl_coef > 0 and obj.kl_placement == "reward"
  if obj.advantage == "gae":
    tok_r = obj_lib.outcome_token_rewards(reward, mask)
    if kl_in_reward:
      tok_r = obj_lib.kl_token_rewards(tok_r, jnp.asarray(prox_logp_BR), jnp.asarray(ref_logp_BR), mask,
                                       coef=obj.kl_coef, kind=obj.kl_estimator)
    res = obj_lib.gae(tok_r, jnp.asarray(values_BR), mask, gamma=obj.gamma, lam=obj.gae_lambda)
    adv_BR = obj_lib.masked_whiten(res.adv_BR, mask & jnp.asarray(keep_B)[:, None]) if obj.adv_whiten \
        else res.adv_BR
    returns_BR = res.returns_BR
  else:
    if kl_in_reward:
      reward = obj_lib.fold_kl_into_rewards(reward, jnp.asarray(prox_logp_BR), jnp.asarray(ref_logp_BR), mask,
                                            coef=obj.kl_coef, kind=obj.kl_estimator)
    # Filtered answers (overlong, dropped groups) count in no group statistic.
    adv_B = obj_lib.compute_advantages(reward, group_size, obj, valid_B=jnp.asarray(keep_B, bool))
    adv_BR = jnp.broadcast_to(adv_B[:, None], mask.shape)
    returns_BR = jnp.zeros(mask.shape, jnp.float32)
  keep = jnp.asarray(keep_B)[:, None] & mask
  return (np.asarray(jnp.where(keep, adv_BR, 0.0), np.float32),
          np.asarray(jnp.where(keep, returns_BR, 0.0), np.float32))
