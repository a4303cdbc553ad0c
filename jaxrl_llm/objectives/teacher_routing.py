"""Routing the teacher branch: SRPO (docs/objectives.md section 11.4) and multi-teacher by task tag.

Equation numbers are docs/objectives.md's. The route z of eq. 11.15 answers
"should the teacher be used here at all?". SRPO routes per sample: the SDPO
(teacher) loss on failed samples that have usable teacher information, the
GRPO loss elsewhere. Multi-teacher on-policy distillation (section 11.2)
picks the teacher for a sample from its task tag; a tag without a teacher
gives m_i = 0, which is exactly SRPO's "no usable teacher information".
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.objectives.aggregation import BatchNorms, WeightedSum, aggregate


def _check_binary(name: str, x: jax.Array) -> None:
  if x.ndim != 1:
    raise ValueError(f"{name} must be a [B] vector, got shape {x.shape}")
  if x.dtype != jnp.bool_ and not isinstance(x, jax.core.Tracer):
    values = np.unique(np.asarray(x))
    if not np.all(np.isin(values, (0, 1))):
      raise ValueError(f"{name} must be 0/1 (or bool), got values {values.tolist()}")


def srpo_routes(correct_B: jax.Array, has_teacher_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """z_sdpo = (1 - c_i) m_i, z_grpo = 1 - z_sdpo (eq. 11.10). Returns (z_grpo_B, z_sdpo_B) as f32.

  ``correct_B`` is c_i (the verifier says the rollout is correct);
  ``has_teacher_B`` is m_i (usable teacher information exists: feedback, a
  hint, a teacher for the task).
  """
  _check_binary("correct_B", correct_B)
  _check_binary("has_teacher_B", has_teacher_B)
  if correct_B.shape != has_teacher_B.shape:
    raise ValueError(f"correct_B {correct_B.shape} and has_teacher_B {has_teacher_B.shape} differ")
  c_B = correct_B.astype(jnp.float32)
  m_B = has_teacher_B.astype(jnp.float32)
  z_sdpo_B = jax.lax.stop_gradient((1.0 - c_B) * m_B)
  return 1.0 - z_sdpo_B, z_sdpo_B


def srpo_loss(grpo_loss_BR: jax.Array, sdpo_loss_BR: jax.Array, mask_BR: jax.Array,
              z_sdpo_B: jax.Array, *, aggregation: str = "token_mean",
              norms: BatchNorms | None = None) -> WeightedSum:
  """The routed mixture of eq. 11.11 as a (numerator, denominator) pair.

  With ``aggregation="token_mean"`` (eq. 11.11's normalisation):

      numerator   = sum_{i,t} m_it [z_grpo_i l_grpo_it + z_sdpo_i l_sdpo_it]
      denominator = sum_{i,t} m_it [z_grpo_i + z_sdpo_i]  (= the token count)

  with the response mask m_it making sum_{i,t} range over real tokens. The two
  branches share one normaliser, not one each, so a batch that routes more
  samples to SDPO does not rescale GRPO's tokens. Other aggregation modes
  apply their lambda_it to the same routed per-token loss.
  """
  if not grpo_loss_BR.shape == sdpo_loss_BR.shape == mask_BR.shape:
    raise ValueError(f"srpo_loss: grpo loss {grpo_loss_BR.shape}, sdpo loss "
                     f"{sdpo_loss_BR.shape} and mask {mask_BR.shape} must match")
  grpo_mask_BR, sdpo_mask_BR = srpo_branch_masks(mask_BR, z_sdpo_B)
  routed_BR = (jnp.where(grpo_mask_BR, grpo_loss_BR, 0.0)
               + jnp.where(sdpo_mask_BR, sdpo_loss_BR, 0.0))
  return aggregate(routed_BR, mask_BR, aggregation, norms)


def srpo_branch_masks(mask_BR: jax.Array, z_sdpo_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Split the response mask by route: (grpo_mask_BR, sdpo_mask_BR), disjoint, union = mask.

  To build eq. 11.11 from a policy loss that aggregates internally, evaluate the
  GRPO loss on ``grpo_mask_BR`` and the SDPO loss on ``sdpo_mask_BR`` with the
  norms of the *full* mask (``aggregation.batch_norms(mask_BR)``) and add the
  two pairs: the shared normaliser makes the sum equal ``srpo_loss``.
  """
  if z_sdpo_B.shape != mask_BR.shape[:1]:
    raise ValueError(f"srpo: z_sdpo_B {z_sdpo_B.shape} must be [B]={mask_BR.shape[:1]}")
  route_BR = jnp.broadcast_to((z_sdpo_B > 0.5)[:, None], mask_BR.shape)
  mask = mask_BR.astype(jnp.bool_)
  return mask & ~route_BR, mask & route_BR


def srpo_routed_advantage(adv: jax.Array, gap_BR: jax.Array, z_sdpo_B: jax.Array) -> jax.Array:
  """A_srpo = z_grpo A_i + z_sdpo Delta_it (eq. 11.12), detached.

  A bookkeeping view, not SRPO's training loss (that is eq. 11.11,
  ``srpo_loss``): useful as a diagnostic and as a sampled-token variant.
  """
  if z_sdpo_B.shape != gap_BR.shape[:1]:
    raise ValueError(f"srpo_routed_advantage: z_sdpo_B {z_sdpo_B.shape} must be [B]={gap_BR.shape[:1]}")
  adv_BR = adv if adv.shape == gap_BR.shape else jnp.broadcast_to(adv[:, None], gap_BR.shape)
  z_BR = jnp.broadcast_to(z_sdpo_B[:, None], gap_BR.shape)
  return jax.lax.stop_gradient((1.0 - z_BR) * adv_BR + z_BR * gap_BR)


def teacher_for_tasks(task_id_B: jax.Array, teacher_of_task: Sequence[int],
                      num_teachers: int) -> tuple[jax.Array, jax.Array]:
  """Map task tags to teachers: returns (teacher_index_B, has_teacher_B).

  ``teacher_of_task[tag]`` is the index of the teacher for task ``tag``, or -1
  for "no teacher" (the sample gets m_i = 0 and index 0 as a placeholder).
  """
  table = tuple(int(t) for t in teacher_of_task)
  if num_teachers < 1:
    raise ValueError(f"teacher_for_tasks: num_teachers={num_teachers} must be >= 1")
  for tag, idx in enumerate(table):
    if not -1 <= idx < num_teachers:
      raise ValueError(f"teacher_for_tasks: teacher_of_task[{tag}]={idx} is outside "
                       f"[-1, {num_teachers}) (-1 = no teacher)")
  if task_id_B.ndim != 1:
    raise ValueError(f"task_id_B must be [B], got shape {task_id_B.shape}")
  if not isinstance(task_id_B, jax.core.Tracer):
    ids = np.asarray(task_id_B)
    if ids.size and (ids.min() < 0 or ids.max() >= len(table)):
      raise ValueError(f"task_id_B has tags in [{ids.min()}, {ids.max()}], but teacher_of_task "
                       f"covers [0, {len(table)})")
  idx_B = jnp.asarray(table, dtype=jnp.int32)[task_id_B]
  return jnp.maximum(idx_B, 0), idx_B >= 0


def select_teacher(per_teacher_NB: jax.Array, teacher_index_B: jax.Array) -> jax.Array:
  """Pick, for each sample b, row ``per_teacher_NB[teacher_index_B[b], b, ...]``.

  ``per_teacher_NB`` stacks any per-sample teacher output (token log-probs
  [N, B, R], full log-probs [N, B, R, V]) along a leading teacher axis.
  """
  if per_teacher_NB.ndim < 2 or per_teacher_NB.shape[1] != teacher_index_B.shape[0]:
    raise ValueError(f"select_teacher: per_teacher {per_teacher_NB.shape} must be [N, B, ...] with "
                     f"B={teacher_index_B.shape[0]}")
  rows_B = jnp.arange(teacher_index_B.shape[0])
  return jax.lax.stop_gradient(per_teacher_NB[teacher_index_B, rows_B])
