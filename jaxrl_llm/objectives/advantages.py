"""Advantage estimators (docs/objectives.md section 6, eqs. 6.1-6.9).

Outcome estimators take one reward per answer, `rewards_B`, with the G
answers of a prompt in consecutive rows (B = n_prompts * G), and return adv_B:

    raw                    A_i = R_i                               (REINFORCE)
    grpo                   A_i = (R_i - mean_g) / (std_g + eps)    (ddof explicit)
    dr_grpo                A_i = R_i - mean_g                      (no std)
    rloo                   A_i = R_i - (1/(G-1)) sum_{j != i} R_j  (leave-one-out)
    reinforce_pp           A_i = (R_i - mean_B) / (std_B + eps)    (global whitening)
    reinforce_pp_baseline  A_i = whiten_B(R_i - mean_g)            (group baseline, then global)

A group of size 1 or with all rewards equal gets A = 0, never NaN. Equal means equal up to float
noise: a group whose std is at most `rtol` times its largest |R| is a zero-variance group
(`_spread`), since dividing its rounding noise (a float32 mean one ulp off, a recomputed KL term a
few ulp apart between identical rows) by a std of about 0 plus `eps` would turn it into advantages
of order one. Optional
`valid_B` drops filtered answers from every statistic (they get A = 0; a group
left with one valid answer gets 0). For the global whitening, optional
`weights_B` (e.g. answer lengths) make the batch mean/std token-weighted, as
OpenRLHF/verl whiten over tokens when gamma = 1.

GAE (PPO with a value function) works per token: `gae`.

Process supervision (`grpo_process`, eq. 6.10) works per step: a sample's rewards sit at the tokens
where its steps end (a multi-turn episode's turns, training/score.py's `step_rewards`), and a
token's advantage sums the group-normalised rewards of the steps ending at or after it:
`process_advantages`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm.objectives.config import ObjectiveConfig


def _groups(rewards_B, group_size: int):
  if rewards_B.ndim != 1:
    raise ValueError(f"rewards_B must have shape [B], got shape {rewards_B.shape}")
  if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size={group_size!r} is invalid: must be a positive integer")
  if rewards_B.shape[0] % group_size != 0:
    raise ValueError(f"group_size={group_size} does not divide the batch size {rewards_B.shape[0]}: "
                     f"allowed group sizes divide {rewards_B.shape[0]}")
  return rewards_B.astype(jnp.float32).reshape(-1, group_size)


def _valid(valid_B, rewards_B):
  if valid_B is None:
    return jnp.ones(rewards_B.shape, jnp.float32)
  if valid_B.shape != rewards_B.shape:
    raise ValueError(f"valid_B has shape {valid_B.shape}; it must equal rewards_B's shape {rewards_B.shape}")
  return valid_B.astype(jnp.float32)


def _group_stats(rewards_B, group_size, valid_B):
  """(rewards, validity, valid count, centred rewards) per group, [P, G] / [P, 1]."""
  r_PG = _groups(rewards_B, group_size)
  v_PG = _valid(valid_B, rewards_B).reshape(r_PG.shape)
  n_P1 = jnp.sum(v_PG, axis=1, keepdims=True)
  mean_P1 = jnp.sum(v_PG * r_PG, axis=1, keepdims=True) / jnp.maximum(n_P1, 1.0)
  return r_PG, v_PG, n_P1, v_PG * (r_PG - mean_P1)


def _std(centred, n, ddof: int):
  """sqrt(sum x^2 / (n - ddof)); 0 when n - ddof <= 0 (singleton groups)."""
  dof = n - ddof
  var = jnp.sum(jnp.square(centred), axis=-1, keepdims=True) / jnp.maximum(dof, 1)
  return jnp.where(dof > 0, jnp.sqrt(var), 0.0)


def _normalised(centred, std, scale, *, eps: float, rtol: float):
  """centred / (std + eps), and exactly 0 where std <= rtol * scale (rewards equal up to float noise).

  `scale` is the largest |R| the std was taken over: the noise of float32 arithmetic on rewards of
  that size is a few ulp of it (about 1.2e-7 relative each), so a spread of at most `rtol` of it
  (ObjectiveConfig.adv_std_rtol, 1e-4 by default: hundreds of ulp) carries no ranking of the
  answers. A spread above it is normalised as GRPO writes it. rtol=0 turns the test off."""
  noise = std <= rtol * scale
  return jnp.where(noise, 0.0, centred / jnp.where(noise, 1.0, std + eps))


def group_mean_baseline(rewards_B, group_size: int, *, valid_B=None):
  """Dr. GRPO: R_i - mean(R_group) (docs/objectives.md eq. 6.3)."""
  return _group_stats(rewards_B, group_size, valid_B)[3].reshape(-1)


def grpo_advantages(rewards_B, group_size: int, *, ddof: int = 1, eps: float = 1e-6, rtol: float = 1e-4,
                    valid_B=None):
  """GRPO: (R_i - mean_g) / (std_g + eps) (docs/objectives.md eq. 6.2).

  Zero-variance and singleton groups give exactly 0, and so does a group whose std is at most
  `rtol` times its largest |R| (rewards equal up to float noise, `_normalised`).
  """
  if ddof not in (0, 1):
    raise ValueError(f"ddof={ddof!r} is invalid: allowed values are 0 and 1")
  r_PG, v_PG, n_P1, centred = _group_stats(rewards_B, group_size, valid_B)
  scale_P1 = jnp.max(v_PG * jnp.abs(r_PG), axis=1, keepdims=True)
  return _normalised(centred, _std(centred, n_P1, ddof), scale_P1, eps=eps, rtol=rtol).reshape(-1)


def rloo_advantages(rewards_B, group_size: int, *, valid_B=None):
  """RLOO: R_i - mean of the other valid rewards (docs/objectives.md eq. 6.4); 0 without another."""
  r_PG, v_PG, n_P1, _ = _group_stats(rewards_B, group_size, valid_B)
  others = (jnp.sum(v_PG * r_PG, axis=1, keepdims=True) - r_PG) / jnp.maximum(n_P1 - 1.0, 1.0)
  return jnp.where((n_P1 > 1) & (v_PG > 0), r_PG - others, 0.0).reshape(-1)


def whiten(x_B, *, ddof: int = 1, eps: float = 1e-6, rtol: float = 1e-4, weights_B=None):
  """(x - mean) / (std + eps) over the whole batch, optionally weighted.

  Rows of weight 0 are excluded from the statistics and get 0; a batch whose std is at most `rtol`
  times its largest |x| gets 0 everywhere (equal up to float noise, `_normalised`).
  """
  x = x_B.astype(jnp.float32)
  w = jnp.ones_like(x) if weights_B is None else weights_B.astype(jnp.float32)
  total = jnp.sum(w)
  mean = jnp.sum(w * x) / jnp.maximum(total, 1e-30)
  centred = x - mean
  dof = total - ddof
  var = jnp.sum(w * jnp.square(centred)) / jnp.maximum(dof, 1e-30)
  std = jnp.where(dof > 0, jnp.sqrt(var), 0.0)
  scale = jnp.max(jnp.where(w > 0, jnp.abs(x), 0.0))
  return jnp.where(w > 0, _normalised(centred, std, scale, eps=eps, rtol=rtol), 0.0)


def compute_advantages(rewards_B, group_size: int, cfg: ObjectiveConfig, *, valid_B=None, weights_B=None):
  """Outcome advantages adv_B for `cfg.advantage` (GAE is per token: use `gae`).

  valid_B: answers filtered out (False) count in no statistic and get A = 0.
  weights_B: per-answer weights of the global whitening of reinforce_pp(_baseline)
  (e.g. lengths for a token-weighted mean/std); ignored by the group estimators.
  """
  kind = cfg.advantage
  if kind == "gae":
    raise ValueError("ObjectiveConfig.advantage='gae' is per token: call advantages.gae(token_rewards_BR, "
                     "values_BR, mask_BR, gamma=..., lam=...) instead of compute_advantages")
  r_PG = _groups(rewards_B, group_size)  # validates shape and group size
  valid = _valid(valid_B, rewards_B)
  if kind == "raw":
    return r_PG.reshape(-1) * valid
  if kind == "grpo":
    return grpo_advantages(rewards_B, group_size, ddof=cfg.adv_std_ddof, eps=cfg.adv_eps, rtol=cfg.adv_std_rtol,
                           valid_B=valid_B)
  if kind == "dr_grpo":
    return group_mean_baseline(rewards_B, group_size, valid_B=valid_B)
  if kind == "rloo":
    return rloo_advantages(rewards_B, group_size, valid_B=valid_B)
  w = valid if weights_B is None else valid * weights_B.astype(jnp.float32)
  if kind == "reinforce_pp":
    return whiten(rewards_B, ddof=cfg.adv_std_ddof, eps=cfg.adv_eps, rtol=cfg.adv_std_rtol, weights_B=w)
  return whiten(group_mean_baseline(rewards_B, group_size, valid_B=valid_B), ddof=cfg.adv_std_ddof,
                eps=cfg.adv_eps, rtol=cfg.adv_std_rtol, weights_B=w)


def process_advantages(step_reward_BR, step_end_BR, group_size: int, *, ddof: int = 1, eps: float = 1e-6,
                       rtol: float = 1e-4, valid_B=None):
  """Process supervision with GRPO (Shao et al. 2024, DeepSeekMath section 4.1.3; docs/objectives.md
  eq. 6.10). Output i's step j ends at token index(j) (`step_end_BR`) with reward r_i^index(j)
  (`step_reward_BR` there; elsewhere ignored). Every step reward of a group's outputs is normalised
  by the mean and std of all of them, r~ = (r - mean(R_g)) / (std(R_g) + eps), and a token's
  advantage is the sum of the normalised rewards of the steps that end at or after it:

      A_{i,t} = sum_{j : index(j) >= t} r~_i^index(j)

  so tokens after an output's last step get 0. The paper leaves the std's ddof open; it is the
  outcome GRPO's (`adv_std_ddof`). With one step per output, ending at its last token, this is
  outcome GRPO broadcast over the output. A group of one step, or of step rewards equal up to float
  noise (std at most `rtol` times the largest |r|, `_normalised`), gets 0.
  Rows with valid_B False count in no statistic and get 0."""
  if ddof not in (0, 1):
    raise ValueError(f"ddof={ddof!r} is invalid: allowed values are 0 and 1")
  r_BR = jnp.asarray(step_reward_BR, jnp.float32)
  B, R = r_BR.shape
  if B % group_size:
    raise ValueError(f"group_size={group_size} does not divide the batch size {B}")
  valid = jnp.ones((B,), bool) if valid_B is None else jnp.asarray(valid_B, bool)
  end_BR = jnp.asarray(step_end_BR, bool) & valid[:, None]
  e_PN = end_BR.reshape(-1, group_size * R).astype(jnp.float32)  # a group's steps, all outputs
  r_PN = jnp.where(end_BR, r_BR, 0.0).reshape(e_PN.shape)
  n_P1 = jnp.sum(e_PN, axis=1, keepdims=True)
  mean_P1 = jnp.sum(r_PN, axis=1, keepdims=True) / jnp.maximum(n_P1, 1.0)
  centred_PN = e_PN * (r_PN - mean_P1)
  scale_P1 = jnp.max(jnp.abs(r_PN), axis=1, keepdims=True)  # r_PN is 0 off the group's steps
  norm_BR = _normalised(centred_PN, _std(centred_PN, n_P1, ddof), scale_P1, eps=eps, rtol=rtol).reshape(B, R)
  return jnp.flip(jnp.cumsum(jnp.flip(norm_BR, axis=1), axis=1), axis=1)  # sum over steps ending at or after t


def outcome_token_rewards(rewards_B, mask_BR):
  """Place each answer's reward on its last valid token (for GAE): [B, R]."""
  m = mask_BR.astype(jnp.int32)
  idx_T = jnp.arange(mask_BR.shape[1])
  last_B = jnp.max(jnp.where(mask_BR, idx_T[None, :], -1), axis=1)
  onehot = (idx_T[None, :] == last_B[:, None]) & (m > 0)
  return jnp.where(onehot, rewards_B.astype(jnp.float32)[:, None], 0.0)


@struct.dataclass
class GAEResult:
  adv_BR: jax.Array  # [B, R] GAE advantages (0 on padding)
  returns_BR: jax.Array  # [B, R] adv + V: the value targets


def gae(token_rewards_BR, values_BR, mask_BR, *, gamma: float, lam: float) -> GAEResult:
  """Generalised advantage estimation over the valid tokens (Schulman et al., 2015; docs/objectives.md eq. 6.8).

      delta_t = r_t + gamma V_{t'} - V_t,   A_t = delta_t + gamma lam A_{t'},

  where t' is the next VALID token (padding is skipped, V after the last
  valid token is 0). Values are data: no gradient flows into them.
  """
  for name, v in (("gamma", gamma), ("lam", lam)):
    if not 0 <= v <= 1:
      raise ValueError(f"{name}={v!r} is invalid: must lie in [0, 1]")
  if token_rewards_BR.shape != values_BR.shape or values_BR.shape != mask_BR.shape:
    raise ValueError(f"token_rewards_BR {token_rewards_BR.shape}, values_BR {values_BR.shape} and mask_BR "
                     f"{mask_BR.shape} must have the same [B, R] shape")
  r = token_rewards_BR.astype(jnp.float32).T
  v = jax.lax.stop_gradient(values_BR).astype(jnp.float32).T
  m = mask_BR.astype(bool).T

  def step(carry, xs):
    next_v, next_adv = carry
    r_t, v_t, m_t = xs
    delta = r_t + gamma * next_v - v_t
    adv = delta + gamma * lam * next_adv
    new_carry = (jnp.where(m_t, v_t, next_v), jnp.where(m_t, adv, next_adv))
    return new_carry, jnp.where(m_t, adv, 0.0)

  zeros = jnp.zeros(r.shape[1], jnp.float32)
  _, adv_TB = jax.lax.scan(step, (zeros, zeros), (r, v, m), reverse=True)
  adv_BR = adv_TB.T
  return GAEResult(adv_BR=adv_BR, returns_BR=jnp.where(mask_BR, adv_BR + values_BR, 0.0))


def masked_whiten(x_BR, mask_BR, *, eps: float = 1e-6):
  """Whiten over valid tokens (mean 0, std 1); padding stays 0."""
  m = mask_BR.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = jnp.sum(m * x_BR) / n
  var = jnp.sum(m * jnp.square(x_BR - mean)) / n
  return jnp.where(mask_BR, (x_BR - mean) / (jnp.sqrt(var) + eps), 0.0)


def batch_advantages(rewards_B, keep_B, mask_BR, cfg: ObjectiveConfig, group_size: int, *, prox_logp_BR=None,
                     ref_logp_BR=None, values_BR=None, step_reward_BR=None,
                     step_end_BR=None) -> tuple[jax.Array, jax.Array]:
  """A batch's per-token advantages and returns -> (adv_BR, returns_BR), 0 off `keep_B & mask_BR`.

  Outcome advantages per group (`compute_advantages`: GRPO, RLOO, Dr. GRPO, ...) broadcast over the
  response, or GAE over the value head's predictions `values_BR` (PPO, SAO). With
  `cfg.kl_placement == "reward"` the KL to the reference (log pi_prox against log pi_ref) is folded
  into the reward first: per answer for outcome advantages, per token for GAE (docs/objectives.md,
  section 7). Rows with keep=False (filtered, dropped) count in no group statistic. Process
  supervision (`grpo_process`) reads each sample's step rewards and step ends instead of rewards_B
  (`process_advantages`).
  """
  from jaxrl_llm.objectives.kl import fold_kl_into_rewards, kl_token_rewards  # pylint: disable=import-outside-toplevel

  reward = jnp.asarray(rewards_B)
  mask = jnp.asarray(mask_BR)
  keep_B = jnp.asarray(keep_B, bool)
  kl_in_reward = cfg.kl_coef > 0 and cfg.kl_placement == "reward"
  if cfg.advantage == "grpo_process":
    if step_reward_BR is None or step_end_BR is None:
      raise ValueError("batch_advantages: advantage='grpo_process' needs step_reward_BR and step_end_BR")
    adv_BR = process_advantages(step_reward_BR, step_end_BR, group_size, ddof=cfg.adv_std_ddof, eps=cfg.adv_eps,
                                rtol=cfg.adv_std_rtol, valid_B=keep_B)
    returns_BR = jnp.zeros(mask.shape, jnp.float32)
  elif cfg.advantage == "gae":
    tok_r = outcome_token_rewards(reward, mask)
    if kl_in_reward:
      tok_r = kl_token_rewards(tok_r, jnp.asarray(prox_logp_BR), jnp.asarray(ref_logp_BR), mask,
                               coef=cfg.kl_coef, kind=cfg.kl_estimator)
    res = gae(tok_r, jnp.asarray(values_BR), mask, gamma=cfg.gamma, lam=cfg.gae_lambda)
    adv_BR = masked_whiten(res.adv_BR, mask & keep_B[:, None]) if cfg.adv_whiten else res.adv_BR
    returns_BR = res.returns_BR
  else:
    if kl_in_reward:
      reward = fold_kl_into_rewards(reward, jnp.asarray(prox_logp_BR), jnp.asarray(ref_logp_BR), mask,
                                    coef=cfg.kl_coef, kind=cfg.kl_estimator)
    adv_B = compute_advantages(reward, group_size, cfg, valid_B=keep_B)
    adv_BR = jnp.broadcast_to(adv_B[:, None], mask.shape)
    returns_BR = jnp.zeros(mask.shape, jnp.float32)
  keep = keep_B[:, None] & mask
  return jnp.where(keep, adv_BR, 0.0), jnp.where(keep, returns_BR, 0.0)
