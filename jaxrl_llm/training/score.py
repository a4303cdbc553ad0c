"""Score stage: verifier rewards plus DAPO's soft overlong penalty (in tokens)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.training.filters import FilterConfig


def soft_overlong_penalty(length_B: np.ndarray, max_len: int, buffer: int, penalty: float) -> np.ndarray:
  """DAPO eq. 13, lengths in TOKENS: 0 up to max_len - buffer, then falling
  linearly to -penalty at max_len. buffer=0 disables it."""
  if buffer == 0:
    return np.zeros(length_B.shape, np.float32)
  start = max_len - buffer
  over = np.clip(length_B.astype(np.float32) - start, 0.0, float(buffer))
  return (-penalty * over / buffer).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Scores:
  reward_B: np.ndarray  # f32 [B] reward fed to the advantages (verifier + format + length shaping)
  correct_B: np.ndarray  # f32 [B] the verifier's score alone (accuracy)
  failed_B: np.ndarray  # bool [B] the reward function raised
  timed_out_B: np.ndarray  # bool [B] the reward function hung past its timeout


def score(samples: RolloutBatch, runner: RewardRunner, filters: FilterConfig, max_len: int) -> Scores:
  rb = runner(samples.prompts, samples.responses, samples.answers)
  shaped = rb.reward_B + soft_overlong_penalty(samples.length_B, max_len, filters.overlong_buffer,
                                               filters.overlong_penalty)
  return Scores(reward_B=shaped.astype(np.float32), correct_B=rb.correct_B, failed_B=rb.failed_B,
                timed_out_B=rb.timed_out_B)


def concat_scores(parts: list[Scores]) -> Scores:
  return Scores(*(np.concatenate([getattr(p, f.name) for p in parts])
                  for f in dataclasses.fields(Scores)))


def select_scores(s: Scores, rows: np.ndarray) -> Scores:
  return Scores(*(getattr(s, f.name)[rows] for f in dataclasses.fields(Scores)))
