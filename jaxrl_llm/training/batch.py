"""The scored batch an update consumes (the value head of PPO is model/heads.py's)."""

from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class TrainBatch:
  """B scored samples; every array's leading axis is the batch, split over the mesh's batch axes (data x fsdp)."""

  prompt_BP: jax.Array  # int32 [B, P] left-padded prompt tokens
  prompt_mask_BP: jax.Array  # bool [B, P]
  tokens_BR: jax.Array  # int32 [B, R] response tokens (EOS included)
  mask_BR: jax.Array  # bool [B, R] tokens that enter the loss: sampled by the policy, minus filtered samples
  behav_logp_BR: jax.Array  # f32 [B, R] log mu from the sampler
  prox_logp_BR: jax.Array  # f32 [B, R] log pi_prox (params when this batch's updates began)
  ref_logp_BR: jax.Array  # f32 [B, R] log pi_ref (the warm-started model); zeros when unused
  adv_BR: jax.Array  # f32 [B, R] advantages (outcome advantages broadcast over tokens, or GAE)
  returns_BR: jax.Array  # f32 [B, R] value targets (PPO); zeros when unused
  old_values_BR: jax.Array  # f32 [B, R] value predictions before the update (PPO); zeros when unused
  topk_ids_BRK: jax.Array  # int32 [B, R, K] mu's top-k ids (Score Centering, top-k form); K = 0 when unused
  topk_logp_BRK: jax.Array  # f32 [B, R, K] log mu at those ids
  behav_hidden_BRD: jax.Array  # [B, R, D] the sampler's final hidden states, in its dtype (TRM); D = 0 unused
  # name -> an array whose leading axes are [B, R]: the extensions' per-token inputs to the loss (the
  # teacher's: weights f32 [B, R], top-k ids int32 [B, R, K] and log-probs, hidden states [B, R, D])
  extra_BR: dict
  # bool [B, R] what the forward passes attend to: mask_BR plus an episode's observations (context for
  # later turns, weight zero in every loss term and statistic); None: mask_BR (single-turn samples)
  context_BR: jax.Array | None = None
  # model/packing.Packing of these rows (split like them into the update's micro-batches), planned on
  # the host for each mini-batch (training/pack.py); None: the padded layout
  packing: Any = None

  @property
  def attend_BR(self) -> jax.Array:
    """The response tokens the model reads: `context_BR`, or `mask_BR` when there is none."""
    return self.mask_BR if self.context_BR is None else self.context_BR


# Keys of the update's `aux` (non-row inputs: arrays with no batch axis).
AUX_BEHAV_HEAD = "behav_head_DV"  # the sampler's output head w_DV, its dtype (TRM's token KL)
