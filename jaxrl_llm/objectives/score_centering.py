"""Score Centering, kappa = 1 (docs/objectives.md section 8; Marek & Ryabinin, 2026).

The master equation's kappa term needs, per token, a differentiable scalar

    C_{i,t} = sum_v sg(mu(v) W_v) log pi_theta(v | h_{i,t}),   W_v = f(rho(v)),

whose gradient is sum_v mu(v) W_v s_v, the drift; `policy_loss` subtracts it
(kappa = 1). For plain Score Centering W_v = 1; for TIS / MIS + SC W_v is the
correction applied to rho(v) = pi_theta(v) / mu(v) of EVERY vocabulary entry,
so that A (f(rho_y) s_y - sum_v mu_v f(rho_v) s_v) has zero mean under mu for
any f (their appendix A.2).

Two ways to compute C:
* `centering_exact`: from the full next-token log-probs of pi_theta and mu
  (the reference; the trainer may later fuse it with a vocabulary kernel).
* `centering_topk`: from mu's top-k (ids and log-probs, logged by the sampler)
  and pi_theta's log-probs at those ids. The tail is assumed to follow the
  trainer rescaled, mu(v) ~ gamma pi(v) outside the top-k, with
      gamma = (1 - sum_topk mu) / (1 - sum_topk pi),
  and since sum_v pi(v) s_v = 0 the tail is rewritten with top-k terms only:
      C = sum_{v in top-k} sg(mu_v W_v - gamma f(1/gamma) pi_v) log pi(v).
  For W = 1 this is the paper's formula (docs/objectives.md eq. 8.5). With a weight, the tail's ratio is
  rho = 1/gamma (our generalisation, exact when the tail assumption holds).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives.config import CENTERABLE_CORRECTIONS, ObjectiveConfig
from jaxrl_llm.objectives.ratios import clamped_log_ratio


def correction_weight(log_rho, cfg: ObjectiveConfig):
  """f(rho) of a token-level, sign-independent correction, elementwise."""
  if cfg.correction not in CENTERABLE_CORRECTIONS:
    raise ValueError(f"ObjectiveConfig.correction={cfg.correction!r} cannot be centred: allowed values "
                     f"are {CENTERABLE_CORRECTIONS}")
  rho = jnp.exp(log_rho)
  if cfg.correction == "none":
    return jnp.ones_like(rho)
  if cfg.correction == "is":
    return rho
  if cfg.correction == "tis":
    return jnp.minimum(rho, cfg.is_cap)
  if cfg.correction == "mis":
    return jnp.where(log_rho <= math.log(cfg.is_cap), rho, 0.0)
  lo = -jnp.inf if cfg.band_low <= 0 else math.log(cfg.band_low)
  keep = (log_rho >= lo) & (log_rho <= math.log(cfg.band_high))
  return jnp.where(keep, rho if cfg.correction == "band" else 1.0, 0.0)


def _check_vocab_pair(a, b, names):
  if a.shape != b.shape:
    raise ValueError(f"{names[0]} shape {a.shape} must equal {names[1]} shape {b.shape}")


def centering_exact(logp_BRV, behav_logp_BRV, cfg: ObjectiveConfig):
  """C_{i,t} = sum_v sg(mu_v f(rho_v)) log pi_theta(v) from full log-probs: [B, R].

  logp_BRV: normalised log pi_theta (with gradient); behav_logp_BRV: log mu
  (entries of -inf, tokens the sampler could not emit, contribute 0).
  """
  _check_vocab_pair(logp_BRV, behav_logp_BRV, ("logp_BRV", "behav_logp_BRV"))
  sg = jax.lax.stop_gradient
  behav = sg(behav_logp_BRV)
  log_rho = clamped_log_ratio(sg(logp_BRV), behav, log_clamp=cfg.log_ratio_clamp)
  coef = jnp.exp(behav) * correction_weight(log_rho, cfg)
  return jnp.sum(jnp.where(coef != 0, coef * logp_BRV, 0.0), axis=-1)


def centering_topk(topk_logp_BRK, topk_behav_logp_BRK, cfg: ObjectiveConfig, *, tail_tol: float = 1e-6):
  """Top-k Score Centering with the gamma tail rescale: [B, R].

  topk_logp_BRK: log pi_theta at mu's top-k ids (with gradient);
  topk_behav_logp_BRK: mu's log-probs there. When pi_theta's tail mass
  outside the top-k is below `tail_tol` the top-k covers the distribution and
  the tail term is 0 (k = V gives `centering_exact`).
  """
  _check_vocab_pair(topk_logp_BRK, topk_behav_logp_BRK, ("topk_logp_BRK", "topk_behav_logp_BRK"))
  if not tail_tol > 0:
    raise ValueError(f"tail_tol={tail_tol!r} is invalid: must be > 0")
  sg = jax.lax.stop_gradient
  lp, behav = sg(topk_logp_BRK), sg(topk_behav_logp_BRK)
  mu, pi = jnp.exp(behav), jnp.exp(lp)
  w = correction_weight(clamped_log_ratio(lp, behav, log_clamp=cfg.log_ratio_clamp), cfg)
  tail_mu = jnp.clip(1.0 - jnp.sum(mu, axis=-1), 0.0, 1.0)
  tail_pi = jnp.clip(1.0 - jnp.sum(pi, axis=-1), 0.0, 1.0)
  has_tail = tail_pi > tail_tol
  gamma = jnp.where(has_tail, tail_mu / jnp.where(has_tail, tail_pi, 1.0), 0.0)
  # gamma f(1/gamma): the tail's weight; rho_tail = tail_pi / tail_mu in log space.
  log_rho_tail = jnp.clip(jnp.log(jnp.where(has_tail, tail_pi, 1.0)) - jnp.log(jnp.maximum(tail_mu, 1e-30)),
                          -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
  tail_w = gamma * correction_weight(log_rho_tail, cfg)
  coef = mu * w - tail_w[..., None] * pi
  return jnp.sum(jnp.where(coef != 0, coef * topk_logp_BRK, 0.0), axis=-1)


def gather_topk(logp_BRV, topk_ids_BRK):
  """log pi_theta at the given ids: [B, R, K] (differentiable)."""
  return jnp.take_along_axis(logp_BRV, topk_ids_BRK, axis=-1)
