"""Independent numpy (float64) references for the objectives tests.

Everything here is written from the papers' formulas (docs/objectives.md,
sections 2-10) keyed by METHOD NAME with the papers' constants, not from the
library's knobs, so a wrong preset or a wrong transform shows up as a
mismatch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

B, T, V, G = 6, 5, 7, 3
LENGTHS = np.array([5, 3, 0, 4, 2, 5])  # ragged, one pure-padding row
# Per-row perturbation scales: pi_prox = pi_theta + noise, mu = pi_prox + noise.
PROX_SCALE = np.array([0.0, 1e-5, 0.3, 1.0, 2.0, 0.05])
BEHAV_SCALE = np.array([1e-5, 0.0, 0.5, 0.02, 1e-5, 1.5])
SEQ_ADV = np.array([1.3, -0.7, 0.9, -1.1, 0.5, -0.4])


def make_batch(seed: int = 0):
  """Logits of the three policies, sampled tokens, mask and advantages."""
  k = jax.random.split(jax.random.key(seed), 4)
  z = 1.5 * jax.random.normal(k[0], (B, T, V))
  z_prox = z + jnp.asarray(PROX_SCALE, jnp.float32)[:, None, None] * jax.random.normal(k[1], (B, T, V))
  z_behav = z_prox + jnp.asarray(BEHAV_SCALE, jnp.float32)[:, None, None] * jax.random.normal(k[2], (B, T, V))
  y = jax.random.randint(k[3], (B, T), 0, V)
  mask = np.arange(T)[None, :] < LENGTHS[:, None]
  adv = np.broadcast_to(SEQ_ADV[:, None], (B, T)).astype(np.float32)
  return dict(z=z, z_prox=z_prox, z_behav=z_behav, y=y, mask=jnp.asarray(mask), adv=jnp.asarray(adv))


def log_softmax64(z):
  z = np.asarray(z, np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def take(a_BRV, y_BR):
  return np.take_along_axis(np.asarray(a_BRV), np.asarray(y_BR)[..., None], axis=-1)[..., 0]


def ref_lambda(mask, mode, group_size=G, max_len=None):
  """lambda_{i,t} of docs/objectives.md section 5 (and the Dr. GRPO / PipelineRL variants)."""
  m = np.asarray(mask, np.float64)
  n = m.sum(1)
  seqs = (n > 0).sum()
  if mode == "token_mean":
    return m / m.sum()
  if mode == "seq_mean_token_mean":
    return m / np.maximum(n, 1)[:, None] / seqs
  if mode == "seq_mean_token_sum":
    return m / seqs
  if mode == "constant":
    return m / (seqs * (max_len or m.shape[1]))
  if mode == "group_token_mean":
    gl = n.reshape(-1, group_size).sum(1)
    ng = (gl > 0).sum()
    return m / np.maximum(np.repeat(gl, group_size), 1)[:, None] / ng
  raise AssertionError(mode)


def ppo_m(x, a, lo, hi):
  return np.where(((a > 0) & (x > hi)) | ((a < 0) & (x < lo)), 0.0, 1.0)


def seq_prod(x, m):
  return np.exp(np.where(m, np.log(x), 0.0).sum(1))[:, None] * np.ones_like(x)


def seq_geo(x, m):
  n = np.maximum(m.sum(1), 1)
  return np.exp(np.where(m, np.log(x), 0.0).sum(1) / n)[:, None] * np.ones_like(x)


def binary_kl(mu, pi):
  return mu * np.log(mu / pi) + (1 - mu) * np.log((1 - mu) / (1 - pi))


def full_kl(logp_mu, logp_pi):
  return (np.exp(logp_mu) * (logp_mu - logp_pi)).sum(-1)


def spec_weight(name, r, c, rho, a, m, pi_y, mu_y, kl):
  """W_{i,t} of the method `name` (docs/objectives.md section 10)."""
  grpo = ppo_m(r, a, 0.8, 1.2) * r
  if name in ("reinforce", "rloo", "score_centering"):
    return np.ones_like(r)
  if name in ("grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "ppo"):
    return grpo
  if name == "ppo_dual_clip":
    return grpo * np.where((a < 0) & (r > 3.0), 0.0, 1.0)
  if name == "dapo":
    return ppo_m(r, a, 0.8, 1.28) * r
  if name in ("gspo", "gspo_token"):
    s = seq_geo(r, m)
    return ppo_m(s, a, 1 - 3e-4, 1 + 4e-4) * s
  if name == "cispo":
    return np.clip(r, 0.8, 1.28)
  if name == "decoupled_ppo":
    return c * grpo
  if name == "token_tis":
    return np.minimum(c, 2.0) * grpo
  if name == "icepop":
    return c * ((c >= 0.5) & (c <= 5.0)) * grpo
  if name == "seq_tis":
    return np.minimum(seq_prod(c, m), 2.0) * grpo
  if name == "seq_mis":
    ci = seq_prod(c, m)
    return ci * (ci <= 2.0) * grpo
  if name == "geo_mis":
    cb = seq_geo(c, m)
    return ((cb >= 0.9998) & (cb <= 1.0002)) * grpo
  if name == "scalerl_dapo":
    return ppo_m(rho, a, 0.8, 1.26) * rho
  if name == "scalerl_gspo":
    rb = seq_geo(rho, m)
    return ppo_m(rb, a, 1 - 3e-4, 1 + 4e-4) * rb
  if name == "scalerl_cispo":
    return np.minimum(rho, 5.0)
  if name == "pipelinerl":
    return np.minimum(rho, 1.02)
  if name == "sao":
    return rho * ((rho > 0.7) & (rho < 6.0))
  if name == "topr":
    return np.where(a >= 0, 1.0, np.minimum(seq_prod(rho, m), 1.0))
  if name in ("dppo_tv", "dppo_kl"):
    d = np.abs(mu_y - pi_y) if name == "dppo_tv" else binary_kl(mu_y, pi_y)
    delta = 0.15 if name == "dppo_tv" else 0.05
    drop = ((a > 0) & (rho > 1) & (d > delta)) | ((a < 0) & (rho < 1) & (d > delta))
    return np.where(drop, 0.0, rho)
  if name in ("trm", "trm_avg"):
    if name == "trm":
      keep = np.where(m, kl, -np.inf).max(1) <= 0.05
    else:
      keep = np.where(m, kl, 0.0).sum(1) / np.maximum(m.sum(1), 1) <= 0.001
    return keep[:, None] * rho
  if name == "tis_sc":
    return np.minimum(rho, 2.0)
  if name == "mis_sc":
    return rho * (rho <= 2.0)
  raise AssertionError(f"no reference for {name}")


def spec_vocab_weight(name, rho_v):
  """W_v for the kappa term (Score Centering and its IS combinations)."""
  if name == "score_centering":
    return np.ones_like(rho_v)
  if name == "tis_sc":
    return np.minimum(rho_v, 2.0)
  if name == "mis_sc":
    return rho_v * (rho_v <= 2.0)
  raise AssertionError(name)


KAPPA_ONE = ("score_centering", "tis_sc", "mis_sc")
