"""Score and filter stage: what each sample earns and whether it stays in the batch.

Rewards: the verifier's, plus DAPO's soft overlong penalty (in tokens). Filters: DAPO's dynamic
sampling (keep groups whose rewards differ) and the overlong filter (truncated samples leave the
loss). Dynamic sampling works on whole groups: a group whose G rewards are all equal has zero
advantage everywhere and only dilutes the batch. The step samples more prompts until
`prompts_per_step` informative groups are collected or `max_refill_rounds` extra rounds are spent;
a batch still short is topped up with uninformative groups whose loss mask is cleared, so shapes
stay static and they count nowhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.checks import check_bool, check_float, check_int
from jaxrl_llm.model import distributed
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.sampling.engine import RolloutBatch


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


def soft_overlong_penalty(length_B: np.ndarray, max_len: int | np.ndarray, buffer: int,
                          penalty: float) -> np.ndarray:
  """DAPO eq. 13, lengths in TOKENS: 0 up to max_len - buffer, then falling
  linearly to -penalty at max_len. buffer=0 disables it. `max_len`: one for
  the batch, or each sample's own ([B], `policy_budget`)."""
  if buffer == 0:
    return np.zeros(length_B.shape, np.float32)
  start = np.asarray(max_len, np.float32) - buffer
  over = np.clip(length_B.astype(np.float32) - start, 0.0, float(buffer))
  return (-penalty * over / buffer).astype(np.float32)


def policy_budget(samples: RolloutBatch, max_len: int) -> np.ndarray:
  """int32 [B]: the tokens each sample's policy had room to sample, the L_max of the soft overlong
  penalty against its policy tokens (`length_B`). A single-turn answer: `max_len`
  (rollout.max_response_len). An episode: `max_len` (env.max_tokens, its row after the opening prompt)
  less the environment's tokens in its row (its observations), so an episode that filled its room
  gets the whole penalty, as an answer cut at max_response_len does (docs/objectives.md section 6)."""
  budget_B = np.full(np.shape(samples.length_B), max_len, np.int32)
  if samples.episodic:
    env_B = (np.asarray(samples.context_BR, bool) & ~np.asarray(samples.mask_BR, bool)).sum(axis=1)
    budget_B -= env_B.astype(np.int32)
  return budget_B


@dataclasses.dataclass(frozen=True)
class Scores:
  reward_B: np.ndarray  # f32 [B] reward fed to the advantages (verifier + format + length shaping)
  correct_B: np.ndarray  # f32 [B] the verifier's score alone (accuracy)
  failed_B: np.ndarray  # bool [B] the reward function raised
  timed_out_B: np.ndarray  # bool [B] the reward function hung past its timeout
  # Per-step rewards placed where each step ends (f32 / bool [B, R]), when a scorer gives them (a process
  # reward model, training/model_reward.py); None: `step_rewards` places them from the reward parts.
  step_reward_BR: np.ndarray | None = None
  step_end_BR: np.ndarray | None = None


def episode_rewards(reward_parts, format_weight: float) -> tuple[np.ndarray, np.ndarray]:
  """(reward_B, correct_B) of episodes from their reward parts (envs/base.py: each part summed over
  the episode's steps). An episode's reward, the R_i its advantage is computed from (one per episode,
  docs/objectives.md section 6: the A of the master equation is that episode-level advantage on
  every token the policy sampled in it), is the sum of its parts, the "format" part weighted by
  `data.format_weight` as the verifier's format bonus is; its accuracy is its "correct" part (the
  reward when there is none)."""
  reward = np.asarray([sum(v * (format_weight if k == "format" else 1.0) for k, v in p.items())
                       for p in reward_parts], np.float32)
  correct = np.asarray([p.get("correct", r) for p, r in zip(reward_parts, reward)], np.float32)
  return reward, correct


def step_rewards(samples: RolloutBatch, reward_B: np.ndarray, format_weight: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(step_reward_BR, step_end_BR): each sample's rewards placed where its steps end, the input of
  process supervision (`objective.advantage = "grpo_process"`, objectives/advantages.py's
  `process_advantages`). A multi-turn episode's steps are its turns: turn k's reward (its own reward
  parts, weighted as `episode_rewards` weighs an episode's) sits at the last token the policy sampled
  in turn k. A single-turn sample is one step ending at its last token. Whatever `reward_B` holds
  beyond the turns' sum (the soft overlong penalty, an extension's rescoring) goes to the last step,
  so a sample's step rewards always sum to its reward."""
  mask_BR = np.asarray(samples.mask_BR, bool)
  B, R = mask_BR.shape
  step_reward_BR, step_end_BR = np.zeros((B, R), np.float32), np.zeros((B, R), bool)
  turn_BR = np.asarray(samples.turn_BR)
  for b in range(B):
    policy = np.flatnonzero(mask_BR[b])
    if policy.size == 0:
      continue  # no token to carry a step (a dropped request)
    last, placed = int(policy[-1]), 0.0
    for k, parts in enumerate(samples.turn_reward_parts[b] if samples.episodic else ()):
      r = sum(v * (format_weight if name == "format" else 1.0) for name, v in parts.items())
      in_turn = policy[turn_BR[b, policy] == k]
      at = int(in_turn[-1]) if in_turn.size else last  # a turn without sampled tokens: the last step's
      step_reward_BR[b, at] += r
      step_end_BR[b, at] = True
      placed += r
    step_reward_BR[b, last] += float(reward_B[b]) - placed
    step_end_BR[b, last] = True
  return step_reward_BR, step_end_BR


def verify_once(runner: RewardRunner, prompts, responses, answers) -> tuple[np.ndarray, ...]:
  """(reward_B, correct_B, failed_B, timed_out_B) of the verifier. In a multi-process run each sample is
  verified once, by the process that owns its row (`distributed.row_share`), and the results are
  all-gathered, so every process holds the same rewards (a reward that timed out in one process is
  the timeout everywhere) and no process repeats another's work. The RL steps and the evaluations
  both score through it."""
  lo, hi = distributed.row_share(len(responses))
  rb = runner(prompts[lo:hi], responses[lo:hi], answers[lo:hi])
  return distributed.gather_rows((rb.reward_B, rb.correct_B, rb.failed_B, rb.timed_out_B), len(responses))


def score(samples: RolloutBatch, runner: RewardRunner, filters: FilterConfig, max_len: int,
          format_weight: float = 0.0) -> Scores:
  """What each sample earns: the verifier `runner` on its response, or an episode's own reward parts
  (`episode_rewards`, format part weighted by `format_weight`); plus the soft overlong penalty on its
  policy tokens against `policy_budget(samples, max_len)`."""
  if samples.episodic:
    reward_B, correct_B = episode_rewards(samples.reward_parts, format_weight)
    failed_B = timed_out_B = np.zeros(reward_B.shape, bool)  # a verifier's failure scores its episode 0
  else:
    reward_B, correct_B, failed_B, timed_out_B = verify_once(runner, samples.prompts, samples.responses, samples.answers)
  shaped = reward_B + soft_overlong_penalty(samples.length_B, policy_budget(samples, max_len),
                                            filters.overlong_buffer, filters.overlong_penalty)
  return Scores(reward_B=shaped.astype(np.float32), correct_B=correct_B, failed_B=failed_B, timed_out_B=timed_out_B)


def concat_scores(parts: list[Scores]) -> Scores:
  def cat(name):
    arrays = [getattr(p, name) for p in parts]
    return None if any(a is None for a in arrays) else np.concatenate(arrays)
  return Scores(*(cat(f.name) for f in dataclasses.fields(Scores)))


def select_scores(s: Scores, rows: np.ndarray) -> Scores:
  return Scores(*(None if getattr(s, f.name) is None else getattr(s, f.name)[rows] for f in dataclasses.fields(Scores)))
