"""Filter stage: DAPO dynamic sampling (keep groups whose rewards differ) and
the overlong filter (truncated samples leave the loss).

Dynamic sampling works on whole groups: a group whose G rewards are all equal
has zero advantage everywhere and only dilutes the batch. The loop samples
more prompts until `prompts_per_step` informative groups are collected or
`max_refill_rounds` extra rounds are spent; a batch still short is topped up
with uninformative groups whose loss mask is cleared, so shapes stay static
and they count nowhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.checks import check_bool, check_float, check_int


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """The run config's `filters` section (keys documented in training/defaults.py)."""

  dynamic_sampling: bool
  max_refill_rounds: int
  overlong_filter: bool
  overlong_buffer: int
  overlong_penalty: float

  def __post_init__(self):
    check_bool("config.filters.dynamic_sampling", self.dynamic_sampling)
    check_int("config.filters.max_refill_rounds", self.max_refill_rounds, 0, 100)
    check_bool("config.filters.overlong_filter", self.overlong_filter)
    check_int("config.filters.overlong_buffer", self.overlong_buffer, 0)
    check_float("config.filters.overlong_penalty", self.overlong_penalty, 0.0, 100.0)


def informative_groups(reward_B: np.ndarray, group_size: int) -> np.ndarray:
  """bool [n_groups]: the group's rewards are not all equal."""
  r_NG = reward_B.reshape(-1, group_size)
  return np.ptp(r_NG, axis=1) > 1e-6


def choose_groups(reward_B: np.ndarray, group_size: int, n_wanted: int) -> tuple[np.ndarray, np.ndarray]:
  """-> (rows [n_wanted * G], keep_B [n_wanted * G]) picking informative groups
  first (in order), then uninformative ones marked keep=False."""
  inf_N = informative_groups(reward_B, group_size)
  order = np.concatenate([np.flatnonzero(inf_N), np.flatnonzero(~inf_N)])[:n_wanted]
  if len(order) < n_wanted:
    raise ValueError(f"dynamic sampling: only {len(order)} groups sampled, {n_wanted} needed")
  rows = (order[:, None] * group_size + np.arange(group_size)[None, :]).reshape(-1)
  keep = np.repeat(inf_N[order], group_size)
  return rows, keep


def overlong_keep(truncated_B: np.ndarray, enabled: bool) -> np.ndarray:
  """bool [B]: samples that stay in the loss (all of them unless the filter is on)."""
  return ~truncated_B if enabled else np.ones(truncated_B.shape, bool)
