"""Probability ratios between the three policies (docs/objectives.md section 1).

    rho_{i,t} = pi_theta / mu = r_{i,t} c_{i,t},
    r_{i,t}   = pi_theta / pi_prox   (trust region),
    c_{i,t}   = pi_prox / mu         (off-policy correction).

Every ratio is built from a log-ratio that is clamped to
[-log_clamp, log_clamp] *before* exp, so a stray -inf or a 50-nat gap never
produces inf/nan (verl uses 20). The clamp is a named parameter; inside the
clamp range it changes nothing.

Sequence-level ratios (docs/objectives.md eqs. 1.3-1.4):
    product         c_i = prod_t c_{i,t}               (Seq-TIS, Seq-MIS, TOPR)
    geometric mean  s_i = exp(mean_t log r_{i,t})      (GSPO, Geo-MIS, ScaleRL-GSPO)
Both are computed in log space over the valid tokens only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

DEFAULT_LOG_CLAMP = 20.0


def clamped_log_ratio(logp_num, logp_den, *, log_clamp: float = DEFAULT_LOG_CLAMP):
  """clip(log p_num - log p_den, -log_clamp, log_clamp)."""
  if log_clamp <= 0:
    raise ValueError(f"log_clamp={log_clamp!r} is invalid: must be > 0")
  return jnp.clip(logp_num - logp_den, -log_clamp, log_clamp)


@struct.dataclass
class TokenRatios:
  """Clamped per-token log-ratios; `r`, `c`, `rho` are their exponentials."""

  log_r_BR: jax.Array  # [B, R] log pi_theta - log pi_prox
  log_c_BR: jax.Array  # [B, R] log pi_prox - log mu
  log_rho_BR: jax.Array  # [B, R] log pi_theta - log mu

  @property
  def r(self):
    return jnp.exp(self.log_r_BR)

  @property
  def c(self):
    return jnp.exp(self.log_c_BR)

  @property
  def rho(self):
    return jnp.exp(self.log_rho_BR)


def token_ratios(logp_BR, prox_logp_BR, behav_logp_BR, *, log_clamp: float = DEFAULT_LOG_CLAMP) -> TokenRatios:
  """r, c, rho per token (docs/objectives.md eqs. 1.1-1.2)."""
  return TokenRatios(
      log_r_BR=clamped_log_ratio(logp_BR, prox_logp_BR, log_clamp=log_clamp),
      log_c_BR=clamped_log_ratio(prox_logp_BR, behav_logp_BR, log_clamp=log_clamp),
      log_rho_BR=clamped_log_ratio(logp_BR, behav_logp_BR, log_clamp=log_clamp),
  )


def seq_log_product(log_ratio_BR, mask_BR, *, log_clamp: float = DEFAULT_LOG_CLAMP):
  """log prod_t x_{i,t} = sum_t m log x, clamped: shape [B]."""
  s = jnp.sum(jnp.where(mask_BR, log_ratio_BR, 0.0), axis=1)
  return jnp.clip(s, -log_clamp, log_clamp)


def seq_log_geomean(log_ratio_BR, mask_BR, *, log_clamp: float = DEFAULT_LOG_CLAMP):
  """log of the geometric mean (1/|y_i|) sum_t m log x: shape [B] (GSPO s_i).

  An empty row has geometric mean 1 (log 0).
  """
  n = jnp.sum(mask_BR.astype(jnp.float32), axis=1)
  s = jnp.sum(jnp.where(mask_BR, log_ratio_BR, 0.0), axis=1) / jnp.maximum(n, 1.0)
  return jnp.clip(s, -log_clamp, log_clamp)


def gspo_token_log_ratio(logp_BR, seq_log_ratio_B):
  """GSPO-token: log s_{i,t} = log pi(y_t) - sg(log pi(y_t)) + sg(log s_i).

  Its value is log s_i for every token, and its gradient is grad log pi(y_t),
  so s_{i,t} A_{i,t} has gradient s_i A_{i,t} grad log pi(y_t) (Zheng et al.,
  2025, section 4.3; docs/objectives.md section 3): the sequence weight with per-token advantages.
  """
  sg = jax.lax.stop_gradient
  return logp_BR - sg(logp_BR) + sg(seq_log_ratio_B)[:, None]
