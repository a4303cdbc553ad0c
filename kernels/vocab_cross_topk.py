"""Vocabulary cross terms against q given as top-k (ids, log-probs).

p = softmax(hidden_ND @ w_DV / temperature) carries the gradient; q is known
only at K ids per token (``q_ids_NK``, ``q_logp_NK``: log-probs normalised over
the full vocabulary, as the sampler records them) and is stop-gradient. The
rest of q is fixed by ``tail``:

- ``"rescale"`` (Score Centering's top-k approximation, docs/objectives.md
  eq. 8.5): outside the top-k, q(v) = gamma sg(p(v)) with
  gamma = (1 - sum_k q_k) / (1 - sum_k p_k). Then the gradient of
  ``cross = sum_v q(v) log p(v)`` is sum_k (q_k - gamma p_k) s_k, the paper's
  top-k estimate of s_bar (because sum_v p(v) s_v = 0), so the SC term of a
  token is ``adv * (logp_y - cross)``. Values need the entropy too:
      cross = sum_k q_k lp_k + gamma (-H(p) - sum_k p_k lp_k)
      kl_qp = sum_k q_k (lq_k - lp_k) + (1 - sum_k q_k) log gamma
      kl_pq = sum_k p_k (lp_k - lq_k) - (1 - sum_k p_k) log gamma
  with gradients (q and gamma fixed) sum_k c_k s_k, c_k = q_k - gamma p_k for
  cross, -c_k for kl_qp and p_k (lp_k - lq_k + log gamma) for kl_pq. When p's
  top-k mass leaves less than ``tail_tol`` outside, gamma = 0 and the tail
  terms vanish (kl_pq is then +inf if q has tail mass: q is 0 where p is not).
- ``"renormalize"``: p and q both restricted to the K ids and renormalised
  there (the usual top-k distillation convention); equal to the full terms at
  K = V.

Everything reduces to log p at the K ids plus p's entropy, so this module has
no kernel of its own: it calls ``gather_logprobs`` (one streaming pass, K
compares per logit) and combines with stop-gradient surrogates. Ids must be
distinct within a token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.kernels.config import (VocabTiles, check_hidden_w, check_ids,
                                      check_mask)
from jaxrl_llm.kernels.token_logprobs import (TokenLogprobs,
                                              full_logits_reference,
                                              gather_logprobs)
from jaxrl_llm.kernels.vocab_cross import VocabCross, apply_mask

CROSS_TOPK_TAILS = ("rescale", "renormalize")
_sg = jax.lax.stop_gradient


def check_cross_topk(hidden_ND, w_DV, q_ids_NK, q_logp_NK, tail, tail_tol, mask_N):
  """Checks the arguments of ``vocab_cross_topk`` (and its sharded form); -> mask_N."""
  n, _, v = check_hidden_w(hidden_ND, w_DV)
  if tail not in CROSS_TOPK_TAILS:
    raise ValueError(f"tail={tail!r}: must be one of {CROSS_TOPK_TAILS}")
  if not (isinstance(tail_tol, float) and 0.0 < tail_tol < 1.0):
    raise ValueError(f"tail_tol={tail_tol!r}: must be a float in (0, 1)")
  mask_N = check_mask(mask_N, n)
  if getattr(q_ids_NK, "ndim", None) != 2 or q_ids_NK.shape[0] != n:
    raise ValueError(f"q_ids_NK has shape {getattr(q_ids_NK, 'shape', None)}:"
                     f" must be ({n}, K)")
  if getattr(q_logp_NK, "shape", None) != q_ids_NK.shape:
    raise ValueError(f"q_logp_NK has shape {getattr(q_logp_NK, 'shape', None)}"
                     f": must equal q_ids_NK's {q_ids_NK.shape}")
  if not jnp.issubdtype(q_logp_NK.dtype, jnp.floating):
    raise TypeError(f"q_logp_NK has dtype {q_logp_NK.dtype}: must be floating")
  check_ids(q_ids_NK, q_ids_NK.shape, v, "q_ids_NK", mask_N)
  return mask_N


def _gamma(p_NK, q_NK, tail_tol: float):
  tail_p = jnp.clip(1.0 - jnp.sum(p_NK, axis=1), 0.0, 1.0)
  tail_q = jnp.clip(1.0 - jnp.sum(q_NK, axis=1), 0.0, 1.0)
  has_tail = tail_p > tail_tol
  gamma = jnp.where(has_tail, tail_q / jnp.where(has_tail, tail_p, 1.0), 0.0)
  return gamma, tail_p, tail_q, has_tail


def _surrogate(value_N, coef_NK, lp_NK):
  """Value ``value_N`` with gradient sum_k coef_k d lp_k (coef fixed)."""
  return _sg(value_N) + jnp.sum(_sg(coef_NK) * (lp_NK - _sg(lp_NK)), axis=1)


def _rescale_terms(lp_NK, entropy_N, lq_NK, tail_tol):
  p_NK, q_NK = jnp.exp(_sg(lp_NK)), jnp.exp(lq_NK)
  gamma, tail_p, tail_q, has_tail = _gamma(p_NK, q_NK, tail_tol)
  lp_sg = _sg(lp_NK)
  cross = (jnp.sum(q_NK * lp_sg, axis=1)
           + gamma * (-_sg(entropy_N) - jnp.sum(p_NK * lp_sg, axis=1)))
  log_gamma = jnp.log(jnp.where(gamma > 0, gamma, 1.0))
  log_gamma = jnp.where(gamma > 0, log_gamma, -jnp.inf)
  q_tail_term = jnp.where(tail_q > 0, tail_q * log_gamma, 0.0)
  p_tail_term = jnp.where(has_tail, tail_p * log_gamma, 0.0)
  kl_qp = jnp.sum(q_NK * (lq_NK - lp_sg), axis=1) + q_tail_term
  kl_pq = jnp.sum(p_NK * (lp_sg - lq_NK), axis=1) - p_tail_term
  c_NK = q_NK - gamma[:, None] * p_NK
  lg_N1 = jnp.where(has_tail, log_gamma, 0.0)[:, None]
  return VocabCross(
      cross=_surrogate(cross, c_NK, lp_NK),
      kl_pq=_surrogate(kl_pq, p_NK * (lp_sg - lq_NK + lg_N1), lp_NK),
      kl_qp=_surrogate(kl_qp, -c_NK, lp_NK))


def _renormalized_terms(lp_NK, lq_NK):
  lp_NK = lp_NK - jax.nn.logsumexp(lp_NK, axis=1, keepdims=True)
  lq_NK = lq_NK - jax.nn.logsumexp(lq_NK, axis=1, keepdims=True)
  p_NK, q_NK = jnp.exp(lp_NK), jnp.exp(lq_NK)
  return VocabCross(cross=jnp.sum(q_NK * lp_NK, axis=1),
                    kl_pq=jnp.sum(p_NK * (lp_NK - lq_NK), axis=1),
                    kl_qp=jnp.sum(q_NK * (lq_NK - lp_NK), axis=1))


def cross_topk_terms(out: TokenLogprobs, q_logp_NK, *, tail: str, tail_tol: float,
                     mask_N) -> VocabCross:
  """The terms from ``out``, p's log-probs at q's K ids and p's entropy (from
  ``gather_logprobs`` or its vocabulary-sharded form), for q's ``q_logp_NK``."""
  lq_NK = _sg(q_logp_NK.astype(jnp.float32))
  if tail == "rescale":
    terms = _rescale_terms(out.logp, out.entropy, lq_NK, tail_tol)
  else:
    terms = _renormalized_terms(out.logp, lq_NK)
  return apply_mask(terms, mask_N)


def vocab_cross_topk(hidden_ND, w_DV, q_ids_NK, q_logp_NK, *, tail: str,
                     temperature=1.0, tail_tol: float = 1e-6, mask_N=None,
                     impl="auto", tiles: VocabTiles | None = None,
                     interpret=None) -> VocabCross:
  """cross, KL(p||q), KL(q||p) per token for q given as top-k.

  Logits of p are hidden_ND @ w_DV divided by ``temperature`` before the
  softmax. q_ids_NK: (N, K) distinct ids in [0, V); q_logp_NK: (N, K) log q at
  them (full-vocabulary normalised), stop-gradient. ``tail``: "rescale" |
  "renormalize" (module docstring). Masked tokens return 0 with zero gradient.
  impl, tiles, interpret: see ``config``; ids out of range: as in
  ``gather_logprobs`` (ValueError when concrete, NaN under jit).
  """
  mask_N = check_cross_topk(hidden_ND, w_DV, q_ids_NK, q_logp_NK, tail, tail_tol, mask_N)
  out = gather_logprobs(hidden_ND, w_DV, q_ids_NK, temperature=temperature,
                        impl=impl, tiles=tiles, interpret=interpret)
  return cross_topk_terms(out, q_logp_NK, tail=tail, tail_tol=tail_tol, mask_N=mask_N)


def vocab_cross_topk_reference(hidden_ND, w_DV, q_ids_NK, q_logp_NK, *,
                               tail: str, temperature=1.0,
                               tail_tol: float = 1e-6, mask_N=None,
                               impl="naive", tiles=None,
                               interpret=None) -> VocabCross:
  """Plain-jnp oracle: builds q over the full vocabulary and sums over V."""
  del impl, tiles, interpret
  mask_N = check_cross_topk(hidden_ND, w_DV, q_ids_NK, q_logp_NK, tail, tail_tol, mask_N)
  logp_NV = jax.nn.log_softmax(
      full_logits_reference(hidden_ND, w_DV, temperature), axis=-1)
  v = w_DV.shape[1]
  onehot_NKV = q_ids_NK[:, :, None] == jnp.arange(v)[None, None, :]
  in_topk_NV = jnp.any(onehot_NKV, axis=1)
  q_top_NV = jnp.sum(jnp.where(onehot_NKV, jnp.exp(q_logp_NK)[:, :, None],
                               0.0), axis=1)
  p_NV = jnp.exp(logp_NV)
  if tail == "rescale":
    p_top = jnp.sum(jnp.where(in_topk_NV, p_NV, 0.0), axis=1)
    q_top = jnp.sum(q_top_NV, axis=1)
    tail_p = 1.0 - p_top
    gamma = jnp.where(tail_p > tail_tol, (1.0 - q_top) / tail_p, 0.0)
    q_NV = _sg(jnp.where(in_topk_NV, q_top_NV, gamma[:, None] * p_NV))
  else:
    logp_NV = jnp.where(in_topk_NV, logp_NV, -jnp.inf)
    logp_NV = logp_NV - jax.nn.logsumexp(logp_NV, axis=1, keepdims=True)
    p_NV = jnp.exp(logp_NV)
    q_NV = _sg(q_top_NV / jnp.sum(q_top_NV, axis=1, keepdims=True))
  logq_NV = jnp.log(jnp.where(q_NV > 0, q_NV, 1.0))
  safe_logp = jnp.where(jnp.isfinite(logp_NV), logp_NV, 0.0)
  return apply_mask(VocabCross(
      cross=jnp.sum(jnp.where(q_NV > 0, q_NV * safe_logp, 0.0), axis=1),
      # Where q = 0 and p > 0 the term is +inf (a constant: no gradient).
      kl_pq=jnp.sum(jnp.where(q_NV > 0, p_NV * (safe_logp - logq_NV),
                              jnp.where(p_NV > 0, jnp.inf, 0.0)), axis=1),
      kl_qp=jnp.sum(jnp.where(q_NV > 0, q_NV * (logq_NV - safe_logp), 0.0),
                    axis=1)), mask_N)
