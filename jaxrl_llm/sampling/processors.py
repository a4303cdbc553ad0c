"""Logit processors: logits -> log-probs of the distribution actually sampled.

The sampler draws from, and records log-probs of, one object: the processed
distribution

    mu(y) = softmax(z / tau)[y] renormalised over the kept set, 0 elsewhere,

where the kept set is the intersection of the top-k set, the top-p nucleus
(computed on the top-k-renormalised distribution) and the min-p set
{y : mu_tau(y) >= min_p * max mu_tau}. Recording softmax(z)[y] instead (the
untruncated log-prob) is the bias TRL #6789 describes; the untruncated value
is available separately as `raw_logp`.

Greedy (tau = 0) is the point mass on argmax z: log mu = 0 there, -inf
elsewhere.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

NEG_INF = -jnp.inf


def _keep_from_sorted(keep_BK: jax.Array, ids_BK: jax.Array, vocab: int) -> jax.Array:
  """Scatters a keep flag given in sorted order back to vocabulary order."""
  rows_B1 = jnp.arange(ids_BK.shape[0])[:, None]
  return jnp.zeros((ids_BK.shape[0], vocab), bool).at[rows_B1, ids_BK].set(keep_BK)


def _sorted_candidates(z_BV: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """The k largest entries per row, descending, ties broken by lower id."""
  if k < z_BV.shape[-1]:
    return lax.top_k(z_BV, k)
  ids_BV = jnp.broadcast_to(jnp.arange(z_BV.shape[-1], dtype=jnp.int32)[None, :], z_BV.shape)
  neg_BV, ids_BV = lax.sort((-z_BV, ids_BV), dimension=-1, num_keys=1, is_stable=True)
  return -neg_BV, ids_BV


def process_logits(logits_BV: jax.Array, *, temperature: float, top_k: int = 0,
                   top_p: float = 1.0, min_p: float = 0.0) -> jax.Array:
  """log mu over the vocabulary (f32, -inf outside the kept set).

  Args:
    logits_BV: raw logits of the sampling model.
    temperature: tau >= 0; 0 is greedy.
    top_k: keep exactly the k largest (ties to the lower id); 0 disables.
    top_p: nucleus mass in (0, 1]: keep token i (in descending order) while
      the mass strictly before it is < top_p, i.e. the smallest prefix whose
      mass reaches top_p; 1 disables.
    min_p: keep tokens with mu_tau(y) >= min_p * max_y mu_tau(y); 0 disables.
  """
  z_BV = logits_BV.astype(jnp.float32)
  vocab = z_BV.shape[-1]
  if temperature == 0.0:
    # Point mass on the argmax (ties to the lower id, like jnp.argmax).
    best_B1 = jnp.argmax(z_BV, axis=-1)[:, None]
    return jnp.where(jnp.arange(vocab)[None, :] == best_B1, 0.0, NEG_INF)
  z_BV = z_BV / temperature
  keep_BV = None
  if top_k > 0 or top_p < 1.0:
    vals_BK, ids_BK = _sorted_candidates(z_BV, top_k if top_k > 0 else vocab)
    keep_BK = jnp.ones(vals_BK.shape, bool)
    if top_p < 1.0:
      p_BK = jax.nn.softmax(vals_BK, axis=-1)
      mass_before_BK = jnp.cumsum(p_BK, axis=-1) - p_BK
      keep_BK = mass_before_BK < top_p
    keep_BV = _keep_from_sorted(keep_BK, ids_BK, vocab)
  if min_p > 0.0:
    # p >= min_p * p_max  <=>  z >= z_max + log(min_p); renormalising over
    # the top-k / top-p set scales p and p_max alike, so the order is moot.
    floor_B1 = jnp.max(z_BV, axis=-1, keepdims=True) + jnp.log(min_p)
    keep_min_BV = z_BV >= floor_B1
    keep_BV = keep_min_BV if keep_BV is None else keep_BV & keep_min_BV
  if keep_BV is not None:
    z_BV = jnp.where(keep_BV, z_BV, NEG_INF)
  return jax.nn.log_softmax(z_BV, axis=-1)


def _block_size(vocab: int) -> int:
  """About sqrt(V), rounded up to a multiple of 128: both levels stay short."""
  return 128 * max(1, math.ceil(math.sqrt(vocab) / 128))


def last_true(x_BN: jax.Array) -> jax.Array:
  """Index of the last True along the last axis (0 if none)."""
  n = x_BN.shape[-1]
  return (n - 1 - jnp.argmax(x_BN[..., ::-1], axis=-1)).astype(jnp.int32)


def sample_from_logp(keys_B: jax.Array, logp_BV: jax.Array) -> jax.Array:
  """One token per row from log mu, row b drawn with its own key keys_B[b].

  Inverse-CDF sampling: one uniform u per row, the token is the first id
  whose cumulative mass exceeds u * total. It needs B random numbers per
  step where the Gumbel-max trick needs B x V (the larger cost on a CPU), and
  ids of zero mass (truncated away) can never be drawn: their cumulative mass
  equals their predecessor's.

  The search runs on two levels, so no [B, V] cumulative sum (a long serial
  scan, the costliest part of a step on a CPU when done over V) is built:
  the vocabulary is cut into blocks of C ~ sqrt(V) ids, the block holding the
  target is found from the cumulative block masses, and only that block's
  C masses are accumulated. Where float rounding leaves the target at or
  above every cumulative mass it is compared with (probability ~2^-24), the
  last id of positive mass before that point stands in.

  Per-row keys make a row's sample independent of which other rows share the
  batch (batched == one-by-one for a given row key).
  """
  B, V = logp_BV.shape
  C = _block_size(V)
  N = -(-V // C)
  logp_BV = logp_BV.astype(jnp.float32)
  if N * C != V:
    logp_BV = jnp.pad(logp_BV, ((0, 0), (0, N * C - V)), constant_values=NEG_INF)
  logp_BNC = logp_BV.reshape(B, N, C)
  block_mass_BN = jnp.sum(jnp.exp(logp_BNC), axis=-1)
  cum_BN = jnp.cumsum(block_mass_BN, axis=-1)
  u_B = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys_B)
  target_B = u_B * cum_BN[:, -1]
  # The first block whose cumulative mass exceeds the target (never past
  # the last block of positive mass).
  block_B = jnp.minimum(jnp.sum(cum_BN <= target_B[:, None], axis=-1, dtype=jnp.int32),
                        last_true(block_mass_BN > 0))
  before_B = jnp.take_along_axis(cum_BN - block_mass_BN, block_B[:, None], axis=-1)[:, 0]
  p_BC = jnp.exp(jnp.take_along_axis(logp_BNC, block_B[:, None, None], axis=1)[:, 0])
  above_BC = jnp.cumsum(p_BC, axis=-1) > (target_B - before_B)[:, None]
  within_B = jnp.where(jnp.any(above_BC, axis=-1), jnp.argmax(above_BC, axis=-1),
                       last_true(p_BC > 0))
  return (block_B * C + within_B).astype(jnp.int32)


def gather_logp(logp_BV: jax.Array, ids_B: jax.Array) -> jax.Array:
  """logp_BV[b, ids_B[b]]."""
  return jnp.take_along_axis(logp_BV, ids_B[:, None], axis=-1)[:, 0]
