"""KL to a reference policy and the entropy bonus (docs/objectives.md section 7, eqs. 7.1-7.4).

Per-token estimators of KL(pi_theta || pi_ref) from the sampled token, with
delta = log pi_ref(y) - log pi_theta(y) (Schulman's k1/k2/k3, eq. 7.1):

    k1 = -delta = log pi_theta - log pi_ref          (unbiased, can be < 0)
    k2 = delta^2 / 2                                 (biased, low variance)
    k3 = exp(delta) - delta - 1                      (unbiased, >= 0; GRPO's)

Placement: in the loss (+ beta k per token, aggregated like the policy loss)
or folded into the reward (R - beta sum_t k1_t, the REINFORCE++ / PPO-RLHF
way; `fold_kl_into_rewards`). delta is clamped before exp (log_clamp).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives.config import KL_ESTIMATORS


def kl_penalty(logp_BR, ref_logp_BR, kind: str, *, log_clamp: float = 20.0):
  """Per-token k1 / k2 / k3 estimate of KL(pi_theta || pi_ref): shape of logp_BR."""
  if kind not in KL_ESTIMATORS:
    raise ValueError(f"kind={kind!r} is invalid: allowed KL estimators are {KL_ESTIMATORS}")
  if logp_BR.shape != ref_logp_BR.shape:
    raise ValueError(f"ref_logp_BR shape {ref_logp_BR.shape} must equal logp_BR shape {logp_BR.shape}")
  delta = jnp.clip(ref_logp_BR - logp_BR, -log_clamp, log_clamp)
  if kind == "k1":
    return -delta
  if kind == "k2":
    return 0.5 * jnp.square(delta)
  return jnp.exp(delta) - delta - 1.0


def fold_kl_into_rewards(rewards_B, logp_BR, ref_logp_BR, mask_BR, *, coef: float, kind: str = "k1",
                         log_clamp: float = 20.0):
  """R_i - coef * sum_t m_{i,t} k(pi, pi_ref)_{i,t}: KL folded into the outcome reward.

  logp_BR are the sampling policy's log-probs (no gradient flows: rewards are data).
  """
  if coef < 0:
    raise ValueError(f"coef={coef!r} is invalid: must be >= 0")
  k = kl_penalty(jax.lax.stop_gradient(logp_BR), ref_logp_BR, kind, log_clamp=log_clamp)
  return rewards_B - coef * jnp.sum(jnp.where(mask_BR, k, 0.0), axis=1)


def kl_token_rewards(token_rewards_BR, logp_BR, ref_logp_BR, mask_BR, *, coef: float, kind: str = "k1",
                     log_clamp: float = 20.0):
  """Per-token rewards r_t - coef * k_t (for GAE): the KL penalty at every token."""
  if coef < 0:
    raise ValueError(f"coef={coef!r} is invalid: must be >= 0")
  k = kl_penalty(jax.lax.stop_gradient(logp_BR), ref_logp_BR, kind, log_clamp=log_clamp)
  return token_rewards_BR - coef * jnp.where(mask_BR, k, 0.0)


def entropy_from_logp(logp_BRV):
  """H = -sum_v p_v log p_v from normalised log-probs (0 log 0 = 0): [B, R]."""
  support = logp_BRV > -jnp.inf
  safe = jnp.where(support, logp_BRV, 0.0)
  return -jnp.sum(jnp.where(support, jnp.exp(safe) * safe, 0.0), axis=-1)


def entropy_from_logits(logits_BRV):
  """Entropy of softmax(logits) per position: logsumexp(z) - sum_v p_v z_v."""
  return entropy_from_logp(jax.nn.log_softmax(logits_BRV, axis=-1))
