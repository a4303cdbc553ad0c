"""Masks and truncations: the factors T and f of W = f * T (docs/objectives.md sections 2-4).

Every function takes ratio *values* (the caller stops gradients) and returns
the weight that multiplies grad log pi(y_t) in the master equation, plus
boolean diagnostics. Two shapes of bound (docs/objectives.md section 2):

* masked     M(x) x       : the token keeps weight x inside the range and gets
                            weight 0 (no gradient) once the clip binds;
* truncated  clip(x)      : the token keeps its gradient, the weight is capped
                            (a stop-gradient weight, as in CISPO / TIS).

Log-space inputs (`log_x`) are used for the mask tests so that a sequence
product far outside the float range is still classified exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class PPOWeight:
  """W = M(x) x with PPO's sign-aware mask and dual-clip (docs/objectives.md eqs. 2.3-2.5)."""

  weight: jax.Array  # M * x
  clip_high: jax.Array  # bool: A > 0 and x > 1 + eps_high
  clip_low: jax.Array  # bool: A < 0 and x < 1 - eps_low
  dual_clip: jax.Array  # bool: A < 0 and x > dual_clip_c


def ppo_weight(x, adv, *, eps_low: float, eps_high: float, dual_clip_c: float | None = None) -> PPOWeight:
  """Gradient weight of min(x A, clip(x, 1-eps_low, 1+eps_high) A).

  M = 0 when (A > 0 and x > 1+eps_high) or (A < 0 and x < 1-eps_low): the
  GRPO four-quadrant table. Dual-clip PPO (Ye et al., 2020) bounds the
  objective below at c A for A < 0, i.e. M = 0 also when A < 0 and x > c.
  """
  high = (adv > 0) & (x > 1.0 + eps_high)
  low = (adv < 0) & (x < 1.0 - eps_low)
  if dual_clip_c is None:
    dual = jnp.zeros_like(high)
  else:
    dual = (adv < 0) & (x > dual_clip_c)
  keep = ~(high | low | dual)
  return PPOWeight(weight=jnp.where(keep, x, 0.0), clip_high=high, clip_low=low, dual_clip=dual)


@struct.dataclass
class TruncWeight:
  """W = clip(x, lower, upper), used as a stop-gradient weight."""

  weight: jax.Array
  below: jax.Array  # bool: x < lower (weight raised to lower)
  above: jax.Array  # bool: x > upper (weight capped at upper)


def truncate_weight(x, *, lower: float, upper: float) -> TruncWeight:
  """CISPO / TIS / PipelineRL: sg(clip(x, lower, upper)); lower=0 is one-sided."""
  return TruncWeight(weight=jnp.clip(x, lower, upper), below=x < lower, above=x > upper)


def in_band(log_x, *, lower: float, upper: float):
  """1[lower <= x <= upper], tested in log space (IcePop, SAO, Geo-MIS)."""
  lo = -jnp.inf if lower <= 0 else math.log(lower)
  return (log_x >= lo) & (log_x <= math.log(upper))


def at_most(log_x, *, cap: float):
  """1[x <= cap] in log space (Seq-MIS: one-sided)."""
  return log_x <= math.log(cap)


def topr_weight(rho, adv):
  """TOPR (docs/objectives.md eq. 4.5): f = 1 if A >= 0, min(rho, 1) if A < 0."""
  return jnp.where(adv >= 0, 1.0, jnp.minimum(rho, 1.0))


def binary_tv(logp, behav_logp):
  """DPPO binary total variation |mu(y) - pi_theta(y)| on the sampled token."""
  return jnp.abs(jnp.exp(behav_logp) - jnp.exp(logp))


def _log1m_exp(logp):
  """log(1 - p) from log p, accurate near both ends; -inf at p = 1."""
  logp = jnp.minimum(logp, 0.0)
  return jnp.where(logp > -0.693, jnp.log(-jnp.expm1(logp)), jnp.log1p(-jnp.exp(logp)))


def binary_kl(behav_logp, logp):
  """DPPO binary KL(mu || pi_theta) over {sampled token, everything else}.

      mu log(mu / pi) + (1 - mu) log((1 - mu) / (1 - pi)),
  with 0 log 0 = 0 (docs/objectives.md eq. 4.3b: D compares mu to pi_theta).
  """
  mu = jnp.exp(behav_logp)
  term1 = mu * (behav_logp - logp)
  log1m_mu = _log1m_exp(behav_logp)
  log1m_pi = _log1m_exp(logp)
  one_m_mu = jnp.clip(1.0 - mu, 0.0, 1.0)
  safe = one_m_mu > 0
  term2 = jnp.where(safe, one_m_mu * (jnp.where(safe, log1m_mu, 0.0) - jnp.where(safe, log1m_pi, 0.0)), 0.0)
  return term1 + term2


def dppo_keep(rho, adv, divergence, *, delta: float):
  """DPPO mask (docs/objectives.md eq. 4.2): drop a token when it moved past delta in A's direction.

  M = 0 when (A > 0, rho > 1, D > delta) or (A < 0, rho < 1, D > delta).
  """
  far = divergence > delta
  drop = ((adv > 0) & (rho > 1.0) & far) | ((adv < 0) & (rho < 1.0) & far)
  return ~drop


def full_token_kl(p_logp_BRV, q_logp_BRV):
  """Reference KL(p || q) = sum_v p_v (log p_v - log q_v) per token: [B, R].

  TRM uses KL(mu(.|h) || pi_theta(.|h)): pass mu's full log-probs as p. A
  zero-probability entry of p contributes 0 (0 log 0 = 0).
  """
  support = p_logp_BRV > -jnp.inf
  p_safe = jnp.where(support, p_logp_BRV, 0.0)
  q_safe = jnp.where(support, q_logp_BRV, 0.0)
  return jnp.sum(jnp.where(support, jnp.exp(p_safe) * (p_safe - q_safe), 0.0), axis=-1)


def trm_keep(kl_BR, mask_BR, *, max_delta: float | None, mean_delta: float | None):
  """TRM sequence mask (docs/objectives.md eq. 4.4): keep answer i iff its token KLs pass.

  max variant : max_t KL_{i,t} <= max_delta
  mean variant: (1/|y_i|) sum_t KL_{i,t} <= mean_delta
  Both given: both must pass (the combined setting of the paper). Shape [B].
  """
  if max_delta is None and mean_delta is None:
    raise ValueError("trm_keep needs max_delta or mean_delta (or both); got neither")
  keep = jnp.ones(kl_BR.shape[:1], bool)
  if max_delta is not None:
    keep &= jnp.max(jnp.where(mask_BR, kl_BR, -jnp.inf), axis=1) <= max_delta
  if mean_delta is not None:
    n = jnp.maximum(jnp.sum(mask_BR.astype(jnp.float32), axis=1), 1.0)
    keep &= jnp.sum(jnp.where(mask_BR, kl_BR, 0.0), axis=1) / n <= mean_delta
  return keep
