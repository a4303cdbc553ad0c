"""The master-equation policy loss for any knob setting (docs/objectives.md section 9).

    grad J = E_mu[ sum_{i,t} lambda_{i,t} A_{i,t} (W_{i,t} s_{y_{i,t}} - kappa sum_v mu(v) W_v s_v) ],
    W = f * T,   s_v = grad log pi_theta(v | h_{i,t}).

Sign convention: we MINIMISE loss = -J.

How the loss is built. W is computed from stop-gradient ratios (`master_weights`)
and enters a straight-through surrogate per token

    J_{i,t} = A_{i,t} [ sg(W) exp(log pi(y) - sg(log pi(y)))  -  kappa (C_{i,t} - sg(C_{i,t})) ]

where C_{i,t} = sum_v sg(mu_v W_v) log pi_theta(v) is Score Centering's term
(score_centering.py). Its gradient is exactly the master equation, for every
method at once, and its VALUE is A W: for an unclipped PPO token that is the
familiar r A; a masked token contributes 0. (The masked methods' own
surrogates, e.g. min(rA, clip(r)A), have the same gradient; their value
differs only on clipped tokens.) The loss is -sum lambda J plus the optional
KL-to-reference and entropy terms, aggregated by `aggregation.aggregate`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm.objectives import weights as wts
from jaxrl_llm.objectives.aggregation import BatchNorms, WeightedSum, aggregate, batch_norms, token_weights
from jaxrl_llm.objectives.config import ObjectiveConfig
from jaxrl_llm.objectives.kl import kl_penalty
from jaxrl_llm.objectives.ratios import TokenRatios, seq_log_geomean, seq_log_product, token_ratios

_DIAG_KEYS = (
    "trust/clip_low", "trust/clip_high", "trust/dual_clip",
    "correction/clip_low", "correction/clip_high", "correction/dual_clip", "correction/masked",
)


@struct.dataclass
class MasterWeights:
  """W = f T per token and the diagnostics that produced it (no gradient)."""

  weight_BR: jax.Array  # [B, R] W
  trust_BR: jax.Array  # [B, R] T
  correction_BR: jax.Array  # [B, R] f
  ratios: TokenRatios
  diag: dict  # name -> bool [B, R], keys _DIAG_KEYS


@struct.dataclass
class TokenFactors:
  """Every per-token factor of the master equation as this loss used them ([B, R], no gradient).

  The loss's gradient coefficient of s_y at token (i, t) is lambda A W
  (docs/objectives.md eq. 9.1); with kappa = 1 the term A (C - sg(C)) adds the
  drift. A token the loss masks has W = 0 (its flag in `weights.diag`
  says which bound did it). What the token-weight dump records
  (training/dump.py): the loss's own intermediate values, not a recompute.
  """

  weights: MasterWeights  # W, T, f, the ratios r, c, rho and the mask / clip flags
  adv_BR: jax.Array  # [B, R] A as the loss used it (the answer's mean when adv_level='sequence'); 0 off the mask
  lambda_BR: jax.Array  # [B, R] lambda_{i,t}: the aggregation's weight under the mini-batch's norms
  centering_BR: jax.Array  # [B, R] Score Centering's C_{i,t} (its value); 0 when kappa = 0

  def arrays(self) -> dict:
    """{name: [B, R]}: r, c, rho and their clamped logs, T, f, W, A, lambda, lambda_A_W (= lambda A W),
    C, and each flag of `weights.diag` (bool) under its diagnostics key."""
    mw = self.weights
    out = {"r": mw.ratios.r, "c": mw.ratios.c, "rho": mw.ratios.rho, "log_r": mw.ratios.log_r_BR,
           "log_c": mw.ratios.log_c_BR, "log_rho": mw.ratios.log_rho_BR, "T": mw.trust_BR,
           "f": mw.correction_BR, "W": mw.weight_BR, "A": self.adv_BR, "lambda": self.lambda_BR,
           "lambda_A_W": self.lambda_BR * self.adv_BR * mw.weight_BR, "C": self.centering_BR}
    out.update(mw.diag)
    return out


@struct.dataclass
class PolicyLoss:
  """Loss and diagnostics; every entry combines exactly across micro-batches.

  loss:    WeightedSum (see aggregation.py for the micro-batch contract).
  metrics: additive WeightedSums (fractions, means).
  extrema: keys ending in `_min` / `_max`: combine with min / max.
  counts:  additive sums (tokens, sequences).
  tokens:  the per-token factors the loss used (`TokenFactors`); unused
           outputs of a jitted caller cost nothing (XLA drops them).
  """

  loss: WeightedSum
  metrics: dict
  extrema: dict
  counts: dict
  tokens: TokenFactors


def _seq_broadcast(x_B, shape):
  return jnp.broadcast_to(x_B[:, None], shape)


def sequence_advantage(adv_BR, mask_BR):
  """Per-answer advantage: the masked mean over the answer's tokens, broadcast."""
  m = mask_BR.astype(jnp.float32)
  a_B = jnp.sum(m * adv_BR, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
  return _seq_broadcast(a_B, adv_BR.shape)


def master_weights(logp_BR, prox_logp_BR, behav_logp_BR, adv_BR, mask_BR, cfg: ObjectiveConfig,
                   *, kl_BR=None) -> MasterWeights:
  """W_{i,t} = f T (docs/objectives.md sections 3-4, eq. 9.1), from stop-gradient inputs."""
  sg = jax.lax.stop_gradient
  shape = logp_BR.shape
  mask = mask_BR.astype(bool)
  # Ratios in float32 whatever the log-prob dtype: a bf16 log-ratio is off by ~1%.
  f32 = lambda x: sg(x).astype(jnp.float32)  # noqa: E731
  lp, behav, adv = f32(logp_BR), f32(behav_logp_BR), f32(adv_BR)
  prox = behav if prox_logp_BR is None else f32(prox_logp_BR)
  ratios = token_ratios(lp, prox, behav, log_clamp=cfg.log_ratio_clamp)
  false = jnp.zeros(shape, bool)
  diag = {k: false for k in _DIAG_KEYS}

  # T: trust region on r (token) or s_i (sequence geometric mean).
  if cfg.trust_level == "token":
    log_x = ratios.log_r_BR
  else:
    log_x = _seq_broadcast(seq_log_geomean(ratios.log_r_BR, mask, log_clamp=cfg.log_ratio_clamp), shape)
  x = jnp.exp(log_x)
  if cfg.trust_region == "none":
    trust = jnp.ones(shape)
  elif cfg.trust_region == "ppo":
    pw = wts.ppo_weight(x, adv, eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip_c=cfg.dual_clip_c)
    trust = pw.weight
    diag.update({"trust/clip_low": pw.clip_low, "trust/clip_high": pw.clip_high, "trust/dual_clip": pw.dual_clip})
  else:
    lower, upper = cfg.trunc_bounds
    tw = wts.truncate_weight(x, lower=lower, upper=upper)
    trust = tw.weight
    diag.update({"trust/clip_low": tw.below, "trust/clip_high": tw.above})

  # f: correction on c or rho, at token or sequence level.
  log_y = ratios.log_c_BR if cfg.correction_ratio == "c" else ratios.log_rho_BR
  if cfg.correction_level == "seq_product":
    log_y = _seq_broadcast(seq_log_product(log_y, mask, log_clamp=cfg.log_ratio_clamp), shape)
  elif cfg.correction_level == "seq_geomean":
    log_y = _seq_broadcast(seq_log_geomean(log_y, mask, log_clamp=cfg.log_ratio_clamp), shape)
  y = jnp.exp(log_y)
  kind = cfg.correction
  if kind == "none":
    corr = jnp.ones(shape)
  elif kind == "is":
    corr = y
  elif kind == "tis":
    corr = jnp.minimum(y, cfg.is_cap)
    diag["correction/clip_high"] = y > cfg.is_cap
  elif kind in ("mis", "band", "band_indicator"):
    if kind == "mis":
      keep = wts.at_most(log_y, cap=cfg.is_cap)
    else:
      keep = wts.in_band(log_y, lower=cfg.band_low, upper=cfg.band_high)
    corr = jnp.where(keep, y if kind != "band_indicator" else 1.0, 0.0)
    diag["correction/masked"] = ~keep
  elif kind == "ppo":
    pw = wts.ppo_weight(y, adv, eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip_c=cfg.dual_clip_c)
    corr = pw.weight
    diag.update({"correction/clip_low": pw.clip_low, "correction/clip_high": pw.clip_high,
                 "correction/dual_clip": pw.dual_clip})
  elif kind in ("dppo_tv", "dppo_kl"):
    div = wts.binary_tv(lp, behav) if kind == "dppo_tv" else wts.binary_kl(behav, lp)
    keep = wts.dppo_keep(y, adv, div, delta=cfg.dppo_delta)
    base = y if cfg.dppo_cap is None else jnp.minimum(y, cfg.dppo_cap)
    corr = jnp.where(keep, base, 0.0)
    diag["correction/masked"] = ~keep
  elif kind == "trm":
    if kl_BR is None:
      raise ValueError("correction='trm' needs kl_BR: the per-token KL(mu || pi_theta) over the full "
                       "vocabulary (weights.full_token_kl computes it from full log-probs)")
    keep_B = wts.trm_keep(sg(kl_BR), mask, max_delta=cfg.trm_max_delta, mean_delta=cfg.trm_mean_delta)
    keep = _seq_broadcast(keep_B, shape)
    corr = jnp.where(keep, y, 0.0)
    diag["correction/masked"] = ~keep
  else:  # topr
    corr = wts.topr_weight(y, adv)
    diag["correction/clip_high"] = (adv < 0) & (y > 1.0)
  diag = {k: v & mask for k, v in diag.items()}
  return MasterWeights(weight_BR=corr * trust, trust_BR=trust, correction_BR=corr, ratios=ratios, diag=diag)


def _check_inputs(logp_BR, prox_logp_BR, behav_logp_BR, adv_BR, mask_BR, cfg, norms, centering, kl_BR,
                  ref_logp_BR, entropy_BR):
  if not isinstance(cfg, ObjectiveConfig):
    raise TypeError(f"cfg must be an ObjectiveConfig, got {type(cfg).__name__}")
  if logp_BR.ndim != 2:
    raise ValueError(f"logp_BR must have shape [B, R], got shape {logp_BR.shape}")
  if norms is not None and not isinstance(norms, BatchNorms):
    raise TypeError(f"norms must be a BatchNorms from batch_norms(...) or None, got {type(norms).__name__}")
  shape = logp_BR.shape
  named = {"mask_BR": mask_BR, "behav_logp_BR": behav_logp_BR, "prox_logp_BR": prox_logp_BR,
           "centering": centering, "kl_BR": kl_BR, "ref_logp_BR": ref_logp_BR, "entropy_BR": entropy_BR}
  for name, arr in named.items():
    if arr is not None and arr.shape != shape:
      raise ValueError(f"{name} has shape {arr.shape}; it must equal logp_BR's shape {shape}")
  if adv_BR.shape not in (shape, shape[:1]):
    raise ValueError(f"adv_BR has shape {adv_BR.shape}; allowed shapes are {shape} (per token) "
                     f"and {shape[:1]} (per answer)")
  needs = (("prox_logp_BR", prox_logp_BR, cfg.needs_prox, "its trust region / correction on c uses pi_prox"),
           ("centering", centering, cfg.needs_centering, "kappa=1 (score_centering.centering_exact/_topk)"),
           ("ref_logp_BR", ref_logp_BR, cfg.needs_ref and cfg.kl_placement == "loss", "kl_coef > 0 in the loss"),
           ("entropy_BR", entropy_BR, cfg.needs_entropy, "entropy_coef > 0"))
  for name, arr, needed, why in needs:
    if needed and arr is None:
      raise ValueError(f"{name} is None but ObjectiveConfig(name={cfg.name!r}) needs it: {why}")


def policy_loss(logp_BR, prox_logp_BR, behav_logp_BR, adv_BR, mask_BR, cfg: ObjectiveConfig, *,
                norms: BatchNorms | None, centering=None, kl_BR=None, ref_logp_BR=None,
                entropy_BR=None) -> PolicyLoss:
  """Master-equation loss (-J) with diagnostics.

  logp_BR: log pi_theta(y_t) with gradient; prox_logp_BR: log pi_prox (may be
  None when `cfg.needs_prox` is False: then pi_prox := mu, so c = 1 and the
  r metrics report rho); behav_logp_BR: log mu; adv_BR: [B, R]
  or [B] advantages (treated as constants); mask_BR: valid response tokens.
  norms: `batch_norms` of the full mini-batch (None: this call is the whole
  batch). centering: Score Centering's C_{i,t} (kappa=1). kl_BR: per-token
  KL(mu || pi_theta) for TRM. ref_logp_BR: log pi_ref for an in-loss KL.
  entropy_BR: per-token entropy of pi_theta (with gradient) for the bonus.
  """
  _check_inputs(logp_BR, prox_logp_BR, behav_logp_BR, adv_BR, mask_BR, cfg, norms, centering, kl_BR,
                ref_logp_BR, entropy_BR)
  sg = jax.lax.stop_gradient
  mask = mask_BR.astype(bool)
  shape = logp_BR.shape
  adv = sg(jnp.broadcast_to(adv_BR[:, None], shape) if adv_BR.ndim == 1 else adv_BR).astype(jnp.float32)
  if cfg.adv_level == "sequence":
    adv = sequence_advantage(adv, mask)
  adv = jnp.where(mask, adv, 0.0)
  if norms is None:
    norms = batch_norms(mask_BR, 1, cfg)

  mw = master_weights(logp_BR, prox_logp_BR, behav_logp_BR, adv, mask, cfg, kl_BR=kl_BR)
  logp = jnp.where(mask, logp_BR, 0.0)  # padding may hold -inf; keep it out of values and grads
  surrogate = mw.weight_BR * jnp.exp(logp - sg(logp))
  cent = jnp.zeros(shape, jnp.float32)
  if cfg.kappa == 1:
    cent = jnp.where(mask, centering, 0.0)
    surrogate = surrogate - (cent - sg(cent))
  pg_BR = -adv * surrogate
  total_BR = pg_BR
  parts = {"loss/pg": pg_BR}
  kl_ref_BR = None
  if cfg.kl_coef > 0 and cfg.kl_placement == "loss":
    kl_ref_BR = kl_penalty(logp, jnp.where(mask, ref_logp_BR, 0.0), cfg.kl_estimator,
                           log_clamp=cfg.log_ratio_clamp)
    total_BR = total_BR + cfg.kl_coef * kl_ref_BR
    parts["loss/kl"] = cfg.kl_coef * kl_ref_BR
  if cfg.entropy_coef > 0:
    ent = jnp.where(mask, entropy_BR, 0.0)
    total_BR = total_BR - cfg.entropy_coef * ent
    parts["loss/entropy"] = -cfg.entropy_coef * ent
  loss = aggregate(total_BR, mask, cfg.aggregation, norms)

  metrics = {k: aggregate(v, mask, cfg.aggregation, norms) for k, v in parts.items()}
  m = mask.astype(jnp.float32)
  len_B = jnp.sum(m, axis=1)
  n_tok, n_seq = jnp.sum(m), jnp.sum((len_B > 0).astype(jnp.float32))
  r, c, rho = mw.ratios.r, mw.ratios.c, mw.ratios.rho
  # Token means in one stacked reduction (one op instead of one per metric).
  # x log x - x + 1 >= 0 has mean KL(p || q) under q when x = p / q (tokens come from ~ mu).
  means = {key + "_frac": flag.astype(jnp.float32) for key, flag in mw.diag.items()}
  means.update({
      "ratio/r_mean": r, "ratio/c_mean": c, "ratio/rho_mean": rho,
      "kl/prox_behav": mw.ratios.log_c_BR * c - c + 1.0,
      "kl/theta_prox": mw.ratios.log_r_BR * r - r + 1.0,
      "weight/abs_mean": jnp.abs(mw.weight_BR), "adv/mean": adv,
  })
  if kl_ref_BR is not None:
    means["kl/ref"] = sg(kl_ref_BR)
  if entropy_BR is not None:
    means["entropy/mean"] = sg(entropy_BR)
  sums_K = jnp.sum(jnp.where(mask[None], jnp.stack(list(means.values())), 0.0), axis=(1, 2))
  metrics.update({k: WeightedSum(sums_K[i], n_tok) for i, k in enumerate(means)})
  seq_masked = jnp.any(mw.diag["correction/masked"], axis=1) & (len_B > 0)
  metrics["correction/masked_seq_frac"] = WeightedSum(jnp.sum(seq_masked.astype(jnp.float32)), n_seq)
  ratios_3BT = jnp.stack([r, c, rho])
  mins = jnp.min(jnp.where(mask[None], ratios_3BT, jnp.inf), axis=(1, 2))
  maxs = jnp.max(jnp.where(mask[None], ratios_3BT, -jnp.inf), axis=(1, 2))
  extrema = {}
  for i, name in enumerate(("r", "c", "rho")):
    extrema[f"ratio/{name}_min"] = mins[i]
    extrema[f"ratio/{name}_max"] = maxs[i]
  counts = {"tokens": n_tok, "seqs": n_seq}
  lambda_BR, _ = token_weights(mask, cfg.aggregation, norms)  # the lambda `aggregate` applied to the loss
  tokens = TokenFactors(weights=mw, adv_BR=adv, lambda_BR=lambda_BR, centering_BR=sg(cent).astype(jnp.float32))
  return PolicyLoss(loss=loss, metrics=metrics, extrema=extrema, counts=counts, tokens=tokens)
