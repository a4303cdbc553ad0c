"""On-policy distillation: divergences between a student p and a teacher q.

docs/objectives.md section 11.1 (equation numbers below are its). On each
position t of the student's own rollout,

    p_t(a) = pi_theta(a | c_S, y_<t),   q_t(a) = sg[pi_T(a | c_T, y_<t)]   (eq. 11.1)

and a distillation loss is sum_t m_t D(p_t, q_t) (eq. 11.2). Every function here
takes *normalised* log-probabilities over the last axis (``log_softmax`` of
the logits, at whatever temperature the caller chose) and applies
``stop_gradient`` to the teacher itself, so no gradient ever reaches the
teacher whatever the caller passes.

Entries equal to ``-inf`` (zero probability) are allowed: ``0 * log 0`` terms
are defined as 0 in value and in gradient.

Per-token functions return ``*_BR`` arrays; the masked reduction into a
(numerator, denominator) pair is ``distill_loss`` (any aggregation mode).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.objectives.aggregation import BatchNorms, WeightedSum, aggregate


def _check_pair(student_logp, teacher_logp, what: str = "log-probs"):
  """Student and teacher must share shape, in particular the vocabulary."""
  if student_logp.ndim < 1:
    raise ValueError(f"student {what} must have a vocabulary axis, got shape {student_logp.shape}")
  if student_logp.shape[-1] != teacher_logp.shape[-1]:
    raise ValueError(
        f"vocabulary mismatch: student {what} have vocab size {student_logp.shape[-1]}, "
        f"teacher {what} have {teacher_logp.shape[-1]}; the teacher must use the "
        "student's tokenizer (same vocabulary)")
  if student_logp.shape != teacher_logp.shape:
    raise ValueError(
        f"shape mismatch: student {what} {student_logp.shape} vs teacher {teacher_logp.shape}; "
        "both must be [..., V] over the same positions")


def _kl(logp_a, logp_b):
  """sum_x a(x) [log a(x) - log b(x)] over the last axis, with 0 log 0 = 0.

  Both the value and the gradient of a zero-probability entry of ``a`` are 0
  (the double ``where`` keeps ``0 * inf`` out of the backward pass too).
  """
  support = logp_a > -jnp.inf
  safe_a = jnp.where(support, logp_a, 0.0)
  safe_b = jnp.where(support, logp_b, 0.0)
  terms = jnp.where(support, jnp.exp(safe_a) * (safe_a - safe_b), 0.0)
  return jnp.sum(terms, axis=-1)


def reverse_kl(student_logp_BRV: jax.Array, teacher_logp_BRV: jax.Array) -> jax.Array:
  """KL(p || q) per position: sum_a p(a) [log p(a) - log q(a)] (eq. 11.4).

  The on-policy distillation / SDPO loss; mode seeking. Its negative gradient
  is E_{a~p}[(log q(a) - log p(a)) grad log p(a)] (eq. 11.6), which
  ``reverse_kl_surrogate`` and ``sampled_token_surrogate`` reproduce.
  """
  _check_pair(student_logp_BRV, teacher_logp_BRV)
  return _kl(student_logp_BRV, jax.lax.stop_gradient(teacher_logp_BRV))


def forward_kl(student_logp_BRV: jax.Array, teacher_logp_BRV: jax.Array) -> jax.Array:
  """KL(q || p) per position: sum_a q(a) [log q(a) - log p(a)] (eq. 11.3).

  Includes the teacher's entropy, a constant for the student, so the value is
  a true KL (>= 0, 0 iff p = q); the gradient is that of the cross-entropy
  -sum_a q(a) log p(a), i.e. ``p - q`` in logit space.
  """
  _check_pair(student_logp_BRV, teacher_logp_BRV)
  return _kl(jax.lax.stop_gradient(teacher_logp_BRV), student_logp_BRV)


def generalized_jsd(student_logp_BRV: jax.Array, teacher_logp_BRV: jax.Array,
                    beta: float) -> jax.Array:
  """Generalised Jensen-Shannon divergence with mixture weight ``beta`` in [0, 1].

      M = beta * q + (1 - beta) * p
      JSD_beta = beta * KL(q || M) + (1 - beta) * KL(p || M)

  (eq. 11.5), the convention of GKD (Agarwal et al., 2024) as implemented in TRL's
  ``generalized_jsd_loss``: the endpoints are defined as the KLs, beta = 0 ->
  forward KL(q || p) and beta = 1 -> reverse KL(p || q). (The interior
  expression itself tends to 0 at the endpoints; JSD_beta / beta -> KL(q || p)
  as beta -> 0 and JSD_beta / (1 - beta) -> KL(p || q) as beta -> 1, so the
  endpoint convention is the scaled limit.) beta = 0.5 is the symmetric JSD.
  """
  beta = float(beta)
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"generalized_jsd: beta={beta} is outside the allowed range [0, 1] "
                     "(0 = forward KL(q||p), 1 = reverse KL(p||q))")
  _check_pair(student_logp_BRV, teacher_logp_BRV)
  if beta == 0.0:
    return forward_kl(student_logp_BRV, teacher_logp_BRV)
  if beta == 1.0:
    return reverse_kl(student_logp_BRV, teacher_logp_BRV)
  teacher = jax.lax.stop_gradient(teacher_logp_BRV)
  mix = jnp.logaddexp(teacher + jnp.log(beta), student_logp_BRV + jnp.log1p(-beta))
  return beta * _kl(teacher, mix) + (1.0 - beta) * _kl(student_logp_BRV, mix)


def token_divergence(student_logp_BRV: jax.Array, teacher_logp_BRV: jax.Array, *,
                     kind: str, beta: float = 0.5) -> jax.Array:
  """Dispatch by name: ``reverse_kl`` | ``forward_kl`` | ``jsd`` (uses ``beta``)."""
  if kind == "reverse_kl":
    return reverse_kl(student_logp_BRV, teacher_logp_BRV)
  if kind == "forward_kl":
    return forward_kl(student_logp_BRV, teacher_logp_BRV)
  if kind == "jsd":
    return generalized_jsd(student_logp_BRV, teacher_logp_BRV, beta)
  raise ValueError(f"distill divergence kind={kind!r} is unknown; allowed: "
                   "'reverse_kl', 'forward_kl', 'jsd'")


def teacher_gap(student_token_logp_BR: jax.Array, teacher_token_logp_BR: jax.Array) -> jax.Array:
  """Detached sampled-token teacher gap sg[log q(y_t) - log p(y_t)] (eq. 11.7).

  The advantage-like coefficient of eq. 11.6 evaluated at the sampled token: the
  per-token reward of on-policy distillation (eq. 11.9), the magnitude signal of RLSD (eq. 11.13).
  """
  if student_token_logp_BR.shape != teacher_token_logp_BR.shape:
    raise ValueError(f"teacher_gap: student token log-probs {student_token_logp_BR.shape} and "
                     f"teacher token log-probs {teacher_token_logp_BR.shape} must match")
  return jax.lax.stop_gradient(teacher_token_logp_BR - student_token_logp_BR)


def sampled_token_surrogate(student_token_logp_BR: jax.Array,
                            teacher_token_logp_BR: jax.Array) -> jax.Array:
  """-sg[log q(y_t) - log p(y_t)] * log p(y_t): the advantage form of eq. 11.6.

  With y_t ~ p_t, the expectation of its gradient equals the reverse-KL
  gradient (eq. 11.6); one sample per position is an unbiased estimate. Its
  value is not the KL (use ``reverse_kl`` or the gap for reporting).
  """
  gap_BR = teacher_gap(student_token_logp_BR, teacher_token_logp_BR)
  return -gap_BR * student_token_logp_BR


def reverse_kl_surrogate(student_logp_BRV: jax.Array, teacher_logp_BRV: jax.Array) -> jax.Array:
  """-sum_a sg[p(a) (log q(a) - log p(a))] log p(a): eq. 11.6 summed over the vocabulary.

  The full-vocabulary advantage form: its gradient equals the gradient of
  ``reverse_kl`` exactly (the term sum_a p(a) grad log p(a) = 0 drops out),
  showing the teacher coefficient of eq. 11.6 is the whole story.
  """
  _check_pair(student_logp_BRV, teacher_logp_BRV)
  support = student_logp_BRV > -jnp.inf
  safe_p = jnp.where(support, student_logp_BRV, 0.0)
  safe_q = jnp.where(support, jax.lax.stop_gradient(teacher_logp_BRV), 0.0)
  coef = jax.lax.stop_gradient(jnp.where(support, jnp.exp(safe_p) * (safe_q - safe_p), 0.0))
  return -jnp.sum(coef * safe_p, axis=-1)


def distill_loss(divergence_BR: jax.Array, mask_BR: jax.Array, *, aggregation: str = "token_mean",
                 norms: BatchNorms | None = None,
                 weight_BR: jax.Array | None = None) -> WeightedSum:
  """sum_{i,t} lambda_it m_it w_it D_it as a (numerator, denominator) pair (eqs. 11.2, 11.15).

  ``weight_BR`` carries the trust knobs z * tau of eq. 11.15 and is detached; a
  token whose weight is 0 keeps counting in the normaliser (its teacher branch
  is off, it is not removed from the batch). ``aggregation`` and ``norms`` are
  those of ``aggregation.aggregate`` (pass the full mini-batch's norms when
  micro-batching); ``token_mean`` is eq. 11.2's sum over tokens divided by
  the token count.
  """
  if divergence_BR.shape != mask_BR.shape:
    raise ValueError(f"distill_loss: divergence {divergence_BR.shape} and mask {mask_BR.shape} "
                     "must match")
  loss_BR = divergence_BR
  if weight_BR is not None:
    if weight_BR.shape != mask_BR.shape:
      raise ValueError(f"distill_loss: weight {weight_BR.shape} and mask {mask_BR.shape} must match")
    loss_BR = jax.lax.stop_gradient(weight_BR) * jnp.where(mask_BR, divergence_BR, 0.0)
  return aggregate(loss_BR, mask_BR, aggregation, norms)
