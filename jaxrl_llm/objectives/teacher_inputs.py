"""Teacher inputs on the student's rollout: context + response, positions aligned.

docs/objectives.md eq. 11.1: the teacher scores the student's own tokens y_<t under its
own context c_T (SDPO: the prompt plus feedback, a hint or the reference
answer; on-policy distillation: the same prompt). The teacher does not
generate; it re-scores y with teacher forcing, so its next-token distribution
at response position t must line up with the student's at the same t.

The sequence is ``[context_BC | response_BR]`` in slots. Positions count real
tokens only (``cumsum(mask) - 1``), so left-, right- or mid-padded contexts
give the same positions for the response; padded slots are masked out of
attention. ``predict_index_BR[b, t]`` is the slot whose output predicts
response token t: the last real context slot for t = 0, slot C + t - 1 after.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class TeacherInputs:
  tokens_BS: jax.Array          # [B, C + R] int32: context then response tokens
  positions_BS: jax.Array       # [B, C + R] int32: RoPE positions, counting real tokens
  mask_BS: jax.Array            # [B, C + R] bool: real (attendable) tokens
  predict_index_BR: jax.Array   # [B, R] int32: slot whose output predicts response token t


def build_teacher_inputs(context_tokens_BC: jax.Array, context_mask_BC: jax.Array,
                         response_tokens_BR: jax.Array,
                         response_mask_BR: jax.Array) -> TeacherInputs:
  """Concatenate a (privileged) context with the student's response, positions aligned.

  Every row needs at least one real context token (it predicts the first
  response token).
  """
  if context_tokens_BC.shape != context_mask_BC.shape:
    raise ValueError(f"context tokens {context_tokens_BC.shape} and mask {context_mask_BC.shape} "
                     "must match")
  if response_tokens_BR.shape != response_mask_BR.shape:
    raise ValueError(f"response tokens {response_tokens_BR.shape} and mask "
                     f"{response_mask_BR.shape} must match")
  if context_tokens_BC.shape[0] != response_tokens_BR.shape[0]:
    raise ValueError(f"batch mismatch: context has B={context_tokens_BC.shape[0]}, response "
                     f"has B={response_tokens_BR.shape[0]}")
  if not isinstance(context_mask_BC, jax.core.Tracer):
    counts = np.asarray(context_mask_BC).sum(axis=-1)
    if (counts == 0).any():
      raise ValueError(f"context_mask_BC: rows {np.flatnonzero(counts == 0).tolist()} have no real "
                       "context token; one is needed to predict the first response token")
  ctx_len = context_tokens_BC.shape[1]
  resp_len = response_tokens_BR.shape[1]
  tokens_BS = jnp.concatenate(
      [context_tokens_BC.astype(jnp.int32), response_tokens_BR.astype(jnp.int32)], axis=1)
  mask_BS = jnp.concatenate(
      [context_mask_BC.astype(jnp.bool_), response_mask_BR.astype(jnp.bool_)], axis=1)
  # Positions: real tokens are numbered 0, 1, 2, ... Response slots are numbered
  # after the real context whether or not they are real, so the position of
  # response token t is n_context + t in every padding layout.
  n_ctx_B = jnp.sum(context_mask_BC.astype(jnp.int32), axis=1)
  ctx_pos_BC = jnp.maximum(jnp.cumsum(context_mask_BC.astype(jnp.int32), axis=1) - 1, 0)
  resp_pos_BR = n_ctx_B[:, None] + jnp.arange(resp_len, dtype=jnp.int32)[None, :]
  positions_BS = jnp.concatenate([ctx_pos_BC, resp_pos_BR], axis=1).astype(jnp.int32)
  # The last real context slot predicts response token 0.
  slot_C = jnp.arange(ctx_len, dtype=jnp.int32)
  last_ctx_B = jnp.max(jnp.where(context_mask_BC.astype(jnp.bool_), slot_C[None, :], -1), axis=1)
  later_R = ctx_len + jnp.arange(resp_len, dtype=jnp.int32) - 1
  predict_BR = jnp.where(jnp.arange(resp_len)[None, :] == 0, last_ctx_B[:, None], later_R[None, :])
  return TeacherInputs(tokens_BS=tokens_BS, positions_BS=positions_BS, mask_BS=mask_BS,
                       predict_index_BR=predict_BR.astype(jnp.int32))


def gather_predictions(values_BS: jax.Array, predict_index_BR: jax.Array) -> jax.Array:
  """Pick the per-slot outputs that predict each response token: [B, S, ...] -> [B, R, ...]."""
  if values_BS.shape[0] != predict_index_BR.shape[0]:
    raise ValueError(f"gather_predictions: values {values_BS.shape} and index "
                     f"{predict_index_BR.shape} disagree on B")
  rows_B1 = jnp.arange(values_BS.shape[0])[:, None]
  return values_BS[rows_B1, predict_index_BR]
