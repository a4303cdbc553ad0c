"""data.missing_eos_penalty = p > 0: a sample cut at its length limit without EOS loses p of its
reward (TRL's `missing_eos_penalty`), joined to the loop as an extension.

    score_rewards  R_i <- R_i - p * [i truncated]   (reward_model/rl_reward.py `missing_eos_shaping`)

It runs after the reward model's extension (training/extensions.py's order), so the penalty is a
term of the final reward whatever scored the sample: the reward model's (outside data.reward_clip's
clip and the normalisation: a cut answer loses p however the reward model rates it), the verifier's,
or their mix. A truncated sample is `RolloutBatch.truncated_B`: a single-turn answer that reached
rollout.max_response_len without EOS, or an episode that did not finish. With step rewards (a process
reward model under objective.advantage=grpo_process) the penalty goes to the answer's last step, so
its step rewards still sum to its reward. The overlong filter (filters.overlong_filter) takes such
samples out of the loss instead; the penalty keeps them in and tells the policy to end its answers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.extension import Extension
from jaxrl_llm.reward_model.rl_reward import missing_eos_shaping


class MissingEosPenalty(Extension):
  """data.missing_eos_penalty > 0: -p on the reward of every sample cut without EOS."""

  name = "missing_eos_penalty"

  def __init__(self, data_cfg):
    self.penalty = data_cfg.missing_eos_penalty

  def score_rewards(self, state, samples, scores):
    del state
    truncated_B = np.asarray(samples.truncated_B, bool)
    pen_B = missing_eos_shaping(truncated_B, self.penalty)
    got = np.asarray(samples.sampled_B, bool)
    stats = {"reward/missing_eos_frac": float(truncated_B[got].mean()) if got.any() else 0.0}
    out = dataclasses.replace(scores, reward_B=(scores.reward_B + pen_B).astype(np.float32))
    if scores.step_reward_BR is not None:  # the penalty at each answer's last step end
      step_BR, end_BR = scores.step_reward_BR.copy(), scores.step_end_BR
      for b in np.flatnonzero(truncated_B & end_BR.any(axis=1)):
        step_BR[b, np.flatnonzero(end_BR[b])[-1]] += pen_B[b]
      out = dataclasses.replace(out, step_reward_BR=step_BR)
    return out, stats

  def summary(self) -> dict:
    return {"missing_eos_penalty": self.penalty}
