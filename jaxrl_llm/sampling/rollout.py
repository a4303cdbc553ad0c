"""The rollout record: what the sampler returns for every objective to use."""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np
from flax import struct

from jaxrl_llm.sampling.config import SamplingConfig

# finish_reason_B values.
FINISH_EOS = 0  # the row sampled one of SamplingConfig.eos_ids
FINISH_STOP = 1  # the row sampled one of SamplingConfig.stop_ids
FINISH_LENGTH = 2  # the row reached max_new_tokens without eos or stop
FINISH_NAMES = ("eos", "stop", "length")


@struct.dataclass
class Rollout:
  """B = prompts x n_samples rows (a prompt's samples consecutive), R = max_new_tokens.

  The finishing eos / stop token is part of the response (mask True, its log
  mu recorded): the policy has to learn to emit it. Positions after the
  finish hold pad_id, mask False and zeros in every log-prob field.
  """

  tokens_BR: jax.Array  # [B, R] int32 sampled tokens, pad_id after the finish
  mask_BR: jax.Array  # [B, R] bool, True on the length_B[b] sampled tokens
  behav_logp_BR: jax.Array  # [B, R] f32 log mu(y_t): the processed distribution (see `sampling`)
  finish_reason_B: jax.Array  # [B] int32, FINISH_EOS / FINISH_STOP / FINISH_LENGTH
  length_B: jax.Array  # [B] int32 number of sampled tokens, in [1, R]
  prompt_index_B: jax.Array  # [B] int32 row of the prompt batch this sample answers (b // n_samples)
  raw_logp_BR: Optional[jax.Array] = None  # [B, R] f32 log softmax(logits)[y_t], tau = 1, untruncated; if record_raw_logp
  topk_ids_BRK: Optional[jax.Array] = None  # [B, R, K] int32 the K most likely ids under mu; if record_topk = K > 0
  topk_logp_BRK: Optional[jax.Array] = None  # [B, R, K] f32 log mu of those ids (-inf where truncated away)
  # The processing behind behav_logp_BR (temperature, top-k, top-p, min-p, dtype).
  sampling: SamplingConfig = struct.field(pytree_node=False, default=SamplingConfig())

  def finish_names(self) -> list[str]:
    """finish_reason_B as strings (host side, for logs and reports)."""
    return [FINISH_NAMES[int(r)] for r in np.asarray(self.finish_reason_B)]
