"""Process supervision with GRPO (Shao et al. 2024, DeepSeekMath section 4.1.3; docs/objectives.md
eq. 6.10): the formula written out with loops, against objectives.process_advantages, and its
wiring through batch_advantages and training/score.step_rewards (an episode's turns are its steps)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.objectives import batch_advantages, get_preset, grpo_advantages, process_advantages
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.training.score import step_rewards


def _formula(step_reward_BR, step_end_BR, G, ddof, eps, valid_B):
  """DeepSeekMath 4.1.3 step by step: the group's step rewards R_g, r~ = (r - mean R_g) / (std R_g + eps),
  A_{i,t} = sum of r~ over output i's steps j with index(j) >= t."""
  B, R = step_reward_BR.shape
  adv = np.zeros((B, R))
  for g0 in range(0, B, G):
    steps = [(i, t) for i in range(g0, g0 + G) if valid_B[i] for t in range(R) if step_end_BR[i, t]]
    rs = np.array([step_reward_BR[i, t] for i, t in steps], np.float64)
    if len(rs) - ddof <= 0:
      continue  # one step (ddof 1): no spread, every normalised reward 0
    mean = rs.mean()
    std = np.sqrt(((rs - mean) ** 2).sum() / (len(rs) - ddof))
    norm = {(i, t): (r - mean) / (std + eps) for (i, t), r in zip(steps, rs)}
    for i in range(g0, g0 + G):
      for t in range(R):
        adv[i, t] = sum(v for (j, s), v in norm.items() if j == i and s >= t)
  return adv


@pytest.mark.parametrize("ddof", [0, 1])
def test_process_advantages_equal_the_formula(ddof):
  rng = np.random.default_rng(0)
  B, G, R = 6, 3, 7
  end = rng.random((B, R)) < 0.35
  end[1] = False  # an output without a step
  end[4] = False
  end[4, 2] = True  # one step, not at the end: tokens after it get 0
  reward = rng.normal(size=(B, R)).astype(np.float32) * 2.0
  valid = np.array([True, True, True, True, True, False])
  got = np.asarray(process_advantages(reward, end, G, ddof=ddof, eps=1e-6, valid_B=valid))
  want = _formula(reward, end, G, ddof, 1e-6, valid)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.all(got[4, 3:] == 0) and np.all(got[5] == 0)


def test_one_step_per_output_is_outcome_grpo():
  """Each output one step at its last token: (6.10) is GRPO's A_i (6.2) on every token up to it."""
  rng = np.random.default_rng(1)
  B, G, R = 8, 4, 5
  lengths = rng.integers(1, R + 1, B)
  mask = np.arange(R)[None, :] < lengths[:, None]
  reward_B = rng.normal(size=B).astype(np.float32)
  end = np.zeros((B, R), bool)
  end[np.arange(B), lengths - 1] = True
  step_r = np.where(end, reward_B[:, None], 0.0)
  got = np.asarray(process_advantages(step_r, end, G))
  want = np.asarray(grpo_advantages(jnp.asarray(reward_B), G))
  np.testing.assert_allclose(np.where(mask, got, 0), np.where(mask, want[:, None], 0), rtol=1e-5, atol=1e-6)


def test_batch_advantages_reads_the_steps_and_masks_the_environment():
  obj = dataclasses.replace(get_preset("grpo"), advantage="grpo_process")
  B, G, R = 4, 2, 6
  mask = np.array([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0]], bool)
  end = np.zeros((B, R), bool)
  end[0, [1, 5]] = end[1, 5] = end[2, [0, 3]] = end[3, 2] = True
  step_r = np.where(end, np.arange(B * R, dtype=np.float32).reshape(B, R) / 10, 0.0)
  keep = np.ones(B, bool)
  adv, ret = batch_advantages(np.zeros(B), keep, mask, obj, G, step_reward_BR=step_r, step_end_BR=end)
  want = _formula(step_r, end, G, 1, 1e-6, keep)
  np.testing.assert_allclose(np.asarray(adv), np.where(mask, want, 0.0), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(ret) == 0)
  with pytest.raises(ValueError, match="needs step_reward_BR and step_end_BR"):
    batch_advantages(np.zeros(B), keep, mask, obj, G)
  with pytest.raises(ConfigError, match="ObjectiveConfig.kl_placement"):
    dataclasses.replace(obj, kl_coef=0.1, kl_placement="reward")


def _episodes(turn_reward_parts, reward_parts):
  """Two episodes of R = 8 tokens: turn 0 (policy), an observation, turn 1 (policy)."""
  B, R = len(turn_reward_parts), 8
  mask = np.array([[1, 1, 0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 1, 0, 0]], bool)[:B]
  turn = np.array([[0, 0, 1, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0]], np.int32)[:B]
  z = np.zeros((B, R))
  return RolloutBatch(
      prompt_BP=np.ones((B, 2), np.int32), prompt_mask_BP=np.ones((B, 2), bool), tokens_BR=z.astype(np.int32),
      mask_BR=mask, behav_logp_BR=z, truncated_B=np.zeros(B, bool), length_B=mask.sum(1).astype(np.int32),
      topk_ids_BRK=np.zeros((B, R, 0), np.int32), topk_logp_BRK=np.zeros((B, R, 0)), prompts=("",) * B,
      answers=("",) * B, tags=("",) * B, responses=("",) * B, version_B=np.zeros(B, np.int32),
      context_BR=mask | (turn > 0), turn_BR=turn, statuses=("answer",) * B, reward_parts=tuple(reward_parts),
      turn_reward_parts=tuple(turn_reward_parts))


def test_step_rewards_of_episodes_sit_at_each_turns_last_policy_token():
  turns = (({"correct": 0.0, "format": 1.0}, {"correct": 1.0}), ({"tool": 0.5}, {"correct": 0.0}))
  parts = ({"correct": 1.0, "format": 1.0}, {"tool": 0.5, "correct": 0.0})
  samples = _episodes(turns, parts)
  reward_B = np.array([1.2 - 0.3, 0.5], np.float32)  # format weight 0.2; row 0 also an overlong penalty of -0.3
  r, end = step_rewards(samples, reward_B, format_weight=0.2)
  np.testing.assert_array_equal(np.flatnonzero(end[0]), [1, 6])  # turn 0 ends at token 1, turn 1 at 6
  np.testing.assert_array_equal(np.flatnonzero(end[1]), [2, 5])
  np.testing.assert_allclose(r[0, [1, 6]], [0.2, 1.0 - 0.3])  # the penalty joins the last step
  np.testing.assert_allclose(r[1, [2, 5]], [0.5, 0.0])
  np.testing.assert_allclose(r.sum(1), reward_B, rtol=1e-6)


def test_single_turn_samples_are_one_step_at_their_last_token():
  samples = _episodes(((), ()), ({}, {}))
  samples = dataclasses.replace(samples, statuses=(), reward_parts=(), turn_reward_parts=())
  r, end = step_rewards(samples, np.array([2.0, -1.0], np.float32))
  np.testing.assert_array_equal(np.flatnonzero(end[0]), [6])
  np.testing.assert_array_equal(np.flatnonzero(end[1]), [5])
  np.testing.assert_allclose(r[[0, 1], [6, 5]], [2.0, -1.0])
