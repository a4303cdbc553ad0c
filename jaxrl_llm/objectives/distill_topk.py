"""Top-k teacher approximations for on-policy distillation (docs/objectives.md section 11.1, "Top-k teacher").

An external teacher (an inference server, a sampler that kept only its top-k)
often returns the log-probs of its K most likely tokens, not the full
distribution. The student's full distribution is available. Both are projected
onto a common small support, and any divergence of ``distill.py`` is then
evaluated there. Two conventions, an explicit parameter because trainers
disagree:

* ``tail="bucket"``: K + 1 outcomes, the teacher's top-k ids plus one bucket
  holding the rest of the vocabulary (teacher tail mass 1 - sum_k q_k, student
  tail mass from its own log-probs). Every divergence on the coarsened pair is
  a lower bound of the full one (data processing) and equal to it at K = V.
* ``tail="renormalize"``: K outcomes, both distributions restricted to the
  top-k ids and renormalised there (verl's ``forward_kl_topk`` family uses the
  teacher's top-k without a tail term). Equal to the full divergence at K = V.

If the teacher's top-k mass is 1 (a truncated teacher) while the student has
tail mass, the bucketed reverse KL is +inf: the teacher really assigns zero
probability there. Use ``renormalize`` or a forward divergence in that case.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

TOPK_TAILS = ("bucket", "renormalize")


def topk_support(student_logp_BRV: jax.Array, topk_ids_BRK: jax.Array,
                 teacher_topk_logp_BRK: jax.Array, *,
                 tail: str, tail_tol: float = 1e-6) -> tuple[jax.Array, jax.Array]:
  """Project student and teacher onto the teacher's top-k support.

  Args:
    student_logp_BRV: the student's normalised log-probs over the vocabulary.
    topk_ids_BRK: the teacher's top-k token ids, distinct within a position,
      in [0, V).
    teacher_topk_logp_BRK: the teacher's normalised log-probs of those ids
      (from the full-vocabulary softmax, not renormalised over the k).
    tail: ``"bucket"`` (returns J = K + 1 outcomes, the last is the tail) or
      ``"renormalize"`` (J = K).
    tail_tol: with ``"bucket"``, a teacher tail mass 1 - sum_k q_k at or
      below this is float rounding and counts as 0 (>= 0).

  Returns:
    (student_logp_BRJ, teacher_logp_BRJ), both normalised over J; the
    teacher side is detached.
  """
  if tail not in TOPK_TAILS:
    raise ValueError(f"topk_support: tail={tail!r} is unknown; allowed: {TOPK_TAILS}")
  if not tail_tol >= 0.0:
    raise ValueError(f"topk_support: tail_tol={tail_tol} must be >= 0")
  if topk_ids_BRK.shape != teacher_topk_logp_BRK.shape:
    raise ValueError(f"topk_support: topk_ids {topk_ids_BRK.shape} and teacher_topk_logp "
                     f"{teacher_topk_logp_BRK.shape} must have the same shape [..., K]")
  if topk_ids_BRK.shape[:-1] != student_logp_BRV.shape[:-1]:
    raise ValueError(f"topk_support: top-k leading shape {topk_ids_BRK.shape[:-1]} differs from "
                     f"the student's {student_logp_BRV.shape[:-1]}")
  vocab = student_logp_BRV.shape[-1]
  k = topk_ids_BRK.shape[-1]
  if not 1 <= k <= vocab:
    raise ValueError(f"topk_support: k={k} must be in [1, V={vocab}]")
  if not isinstance(topk_ids_BRK, jax.core.Tracer):
    ids = np.asarray(topk_ids_BRK)  # concrete ids (numpy: also inside another function's jit)
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
      raise ValueError(f"topk_support: topk_ids range [{lo}, {hi}] is outside the student's "
                       f"vocabulary [0, {vocab}); the teacher must share the student's tokenizer")

  teacher_BRK = jax.lax.stop_gradient(teacher_topk_logp_BRK)
  student_BRK = jnp.take_along_axis(student_logp_BRV, topk_ids_BRK, axis=-1)

  if tail == "renormalize":
    return (student_BRK - jax.nn.logsumexp(student_BRK, axis=-1, keepdims=True),
            teacher_BRK - jax.nn.logsumexp(teacher_BRK, axis=-1, keepdims=True))

  # Student tail: logsumexp over the ids outside the top-k (exact, no 1 - sum
  # cancellation). An empty tail (K = V) is -inf with a zero gradient.
  in_topk_BRV = jnp.put_along_axis(jnp.zeros(student_logp_BRV.shape, jnp.bool_), topk_ids_BRK,
                                   True, axis=-1, inplace=False)
  empty_BT1 = jnp.all(in_topk_BRV, axis=-1, keepdims=True)
  outside_BRV = jnp.where(in_topk_BRV | empty_BT1, -jnp.inf, student_logp_BRV)
  safe_BRV = jnp.where(empty_BT1, 0.0, outside_BRV)
  student_tail_BT1 = jnp.where(
      empty_BT1, -jnp.inf, jax.nn.logsumexp(safe_BRV, axis=-1, keepdims=True))
  teacher_tail_BT1 = _teacher_tail(teacher_BRK, vocab, tail_tol)
  return (jnp.concatenate([student_BRK, student_tail_BT1], axis=-1),
          jnp.concatenate([teacher_BRK, teacher_tail_BT1], axis=-1))


def _teacher_tail(teacher_BRK: jax.Array, vocab: int, tail_tol: float) -> jax.Array:
  """log(1 - sum_k q_k) [..., 1], -inf for an empty tail.

  Summing K rounded probabilities leaves an error of order K * eps, which
  would read as (infinitely unlikely) student mass in a bucket the student
  has empty: a tail at or below tail_tol is 0. At K = V the tail is empty by
  definition.
  """
  if teacher_BRK.shape[-1] == vocab:
    return jnp.full(teacher_BRK.shape[:-1] + (1,), -jnp.inf, teacher_BRK.dtype)
  tail_BT1 = 1.0 - jnp.sum(jnp.exp(teacher_BRK), axis=-1, keepdims=True)
  return jnp.where(tail_BT1 > tail_tol, jnp.log(jnp.maximum(tail_BT1, tail_tol)), -jnp.inf)


def topk_support_gathered(student_topk_logp_BRK: jax.Array, teacher_topk_logp_BRK: jax.Array, *,
                          vocab: int, tail: str, tail_tol: float = 1e-6) -> tuple[jax.Array, jax.Array]:
  """``topk_support`` from the student's log-probs at the teacher's ids only.

  For a trainer that never holds the student's [..., V] log-probs
  (``jaxrl_llm.kernels.gather_logprobs`` gives log p at the K ids). Same
  outcomes and conventions as ``topk_support``; with ``"bucket"`` the
  student's tail is log(1 - sum_k p_k) instead of a log-sum-exp over the
  other ids, so a student tail mass at or below ``tail_tol`` (float
  rounding of the sum) counts as 0, like the teacher's. ``vocab`` is V.
  """
  if tail not in TOPK_TAILS:
    raise ValueError(f"topk_support_gathered: tail={tail!r} is unknown; allowed: {TOPK_TAILS}")
  if not tail_tol >= 0.0:
    raise ValueError(f"topk_support_gathered: tail_tol={tail_tol} must be >= 0")
  if student_topk_logp_BRK.shape != teacher_topk_logp_BRK.shape:
    raise ValueError(f"topk_support_gathered: student {student_topk_logp_BRK.shape} and teacher "
                     f"{teacher_topk_logp_BRK.shape} top-k log-probs must have the same shape [..., K]")
  k = student_topk_logp_BRK.shape[-1]
  if not 1 <= k <= vocab:
    raise ValueError(f"topk_support_gathered: k={k} must be in [1, V={vocab}]")
  teacher_BRK = jax.lax.stop_gradient(teacher_topk_logp_BRK)
  student_BRK = student_topk_logp_BRK
  if tail == "renormalize":
    return (student_BRK - jax.nn.logsumexp(student_BRK, axis=-1, keepdims=True),
            teacher_BRK - jax.nn.logsumexp(teacher_BRK, axis=-1, keepdims=True))
  if k == vocab:
    student_tail_BT1 = jnp.full(student_BRK.shape[:-1] + (1,), -jnp.inf, student_BRK.dtype)
  else:
    # The double where keeps the gradient finite where the tail is empty.
    mass_BT1 = 1.0 - jnp.sum(jnp.exp(student_BRK), axis=-1, keepdims=True)
    has_BT1 = mass_BT1 > tail_tol
    student_tail_BT1 = jnp.where(has_BT1, jnp.log(jnp.where(has_BT1, mass_BT1, 1.0)), -jnp.inf)
  return (jnp.concatenate([student_BRK, student_tail_BT1], axis=-1),
          jnp.concatenate([teacher_BRK, _teacher_tail(teacher_BRK, vocab, tail_tol)], axis=-1))
