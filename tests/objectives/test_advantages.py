"""Advantage estimators, GAE and the clipped value loss, against hand arithmetic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.objectives import (compute_advantages, gae, get_preset, grpo_advantages, masked_whiten,
                                  outcome_token_rewards, rloo_advantages, value_loss, whiten)

R = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # G = 4: a mixed group and an all-correct group


def test_grpo_ddof_and_zero_variance():
  # group 1: mean 0.5; ddof=1 std = sqrt(4 * 0.25 / 3) = 0.577350; ddof=0 std = 0.5. group 2: std 0 -> A = 0.
  a1 = grpo_advantages(R, 4, ddof=1, eps=1e-6)
  np.testing.assert_allclose(a1[:4], 0.5 / (np.sqrt(1 / 3) + 1e-6) * np.array([1, -1, -1, 1]), rtol=1e-6)
  a0 = grpo_advantages(R, 4, ddof=0, eps=1e-6)
  np.testing.assert_allclose(a0[:4], 0.5 / (0.5 + 1e-6) * np.array([1, -1, -1, 1]), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(a1[4:]), np.zeros(4))


def test_groups_equal_up_to_float_noise_give_exactly_zero():
  # 8 copies of 0.8071829 (a reward model's score with the KL folded in): the float32 mean of the
  # group is one ulp off the value, so every centred reward is about 6e-8, and dividing by a std of
  # about 6e-8 plus eps = 1e-6 gave A = 0.056 for every sample before the spread test.
  same = jnp.full((8,), 0.8071829, jnp.float32)
  np.testing.assert_array_equal(np.asarray(grpo_advantages(same, 8)), np.zeros(8))
  # Identical rows whose recomputed k1 differs by about 5e-7 (measured in rlhf_arithmetic): still 0.
  jitter = same + jnp.array([0, 5e-7, -5e-7, 0, 2.5e-7, 0, -2.5e-7, 0], jnp.float32)
  np.testing.assert_array_equal(np.asarray(grpo_advantages(jitter, 8)), np.zeros(8))
  # The same for REINFORCE++'s batch whitening and for process supervision's step rewards.
  np.testing.assert_array_equal(np.asarray(compute_advantages(jitter, 4, get_preset("reinforce_pp"))), np.zeros(8))
  from jaxrl_llm.objectives import process_advantages  # pylint: disable=import-outside-toplevel
  end = jnp.zeros((8, 3), bool).at[:, 2].set(True)
  step_r = jnp.zeros((8, 3)).at[:, 2].set(jitter)
  np.testing.assert_array_equal(np.asarray(process_advantages(step_r, end, 8)), np.zeros((8, 3)))
  # A real spread just above the threshold (std 1.2e-4 > 1e-4 * 0.81) is normalised as GRPO writes
  # it: +-1 * 1.2e-4 / (std + eps) with the unbiased std of [a, b, a, b, ...] = 1.2e-4 * sqrt(8 / 7).
  apart = same + jnp.array([1.2e-4, -1.2e-4] * 4, jnp.float32)
  got = np.asarray(grpo_advantages(apart, 8))
  c = np.asarray(apart, np.float64) - np.mean(np.asarray(apart, np.float64))
  want = c / (np.sqrt(np.sum(c ** 2) / 7) + 1e-6)
  np.testing.assert_allclose(got, want, rtol=2e-3)  # the float32 centring of a 1.2e-4 spread on 0.8: ~5e-4 relative
  # rtol = 0 turns the test off: the noise is amplified again, as before.
  assert np.abs(np.asarray(grpo_advantages(same, 8, rtol=0.0))).max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_singleton_and_constant_groups_give_zero_not_nan(name):
  cfg = get_preset(name)
  single = compute_advantages(jnp.array([3.0, -1.0, 2.0]), 1, cfg)
  np.testing.assert_array_equal(np.asarray(single), np.zeros(3))
  const = compute_advantages(jnp.array([2.0, 2.0, 2.0, 2.0]), 2, cfg)
  np.testing.assert_array_equal(np.asarray(const), np.zeros(4))


def test_dr_grpo_and_rloo_golden():
  # Dr. GRPO: [3, 1] - mean 2 = [1, -1].
  np.testing.assert_allclose(compute_advantages(jnp.array([3.0, 1.0]), 2, get_preset("dr_grpo")), [1.0, -1.0])
  # RLOO on [1, 0, 0]: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (twice).
  np.testing.assert_allclose(rloo_advantages(jnp.array([1.0, 0.0, 0.0]), 3), [1.0, -0.5, -0.5])


def test_reinforce_pp_global_whitening():
  # [1, 2, 3, 4]: mean 2.5, unbiased std sqrt(5/3) = 1.290994.
  got = compute_advantages(jnp.array([1.0, 2.0, 3.0, 4.0]), 2, get_preset("reinforce_pp"))
  np.testing.assert_allclose(got, (np.array([1, 2, 3, 4]) - 2.5) / (np.sqrt(5 / 3) + 1e-6), rtol=1e-6)
  # Token-weighted (weights = lengths [1, 3]) on rewards [0, 1]: mean 3/4; var = (0.5625 + 3 * 0.0625) / (4 - 1)
  # = 0.25 -> std 0.5 -> A = [-0.75, 0.25] / 0.5 = [-1.5, 0.5].
  np.testing.assert_allclose(whiten(jnp.array([0.0, 1.0]), weights_B=jnp.array([1.0, 3.0]), eps=0.0), [-1.5, 0.5],
                             rtol=1e-6)


def test_reinforce_pp_group_baseline():
  # [1, 0 | 1, 1] -> group-centred [0.5, -0.5, 0, 0]; mean 0, unbiased std sqrt(0.5 / 3) = 0.408248.
  got = compute_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), 2, get_preset("reinforce_pp_baseline"))
  np.testing.assert_allclose(got, np.array([0.5, -0.5, 0, 0]) / (np.sqrt(0.5 / 3) + 1e-6), rtol=1e-6)


def test_raw_and_dispatch():
  np.testing.assert_array_equal(np.asarray(compute_advantages(R, 4, get_preset("reinforce"))), np.asarray(R))
  np.testing.assert_allclose(compute_advantages(R, 4, get_preset("grpo")), grpo_advantages(R, 4))
  with pytest.raises(ValueError, match="advantage='gae' is per token"):
    compute_advantages(R, 4, get_preset("ppo"))
  with pytest.raises(ValueError, match="group_size=3 does not divide the batch size 8"):
    compute_advantages(R, 3, get_preset("grpo"))


def _naive_gae(r, v, m, gamma, lam):
  adv = np.zeros_like(r)
  for i in range(r.shape[0]):
    idx = [t for t in range(r.shape[1]) if m[i, t]]
    next_v, next_a = 0.0, 0.0
    for t in reversed(idx):
      delta = r[i, t] + gamma * next_v - v[i, t]
      next_a = delta + gamma * lam * next_a
      next_v = v[i, t]
      adv[i, t] = next_a
  return adv


def test_gae_matches_naive_loop_with_padding():
  k1, k2 = jax.random.split(jax.random.key(0))
  mask = jnp.arange(6)[None, :] < jnp.array([6, 4, 1, 0])[:, None]
  rewards = outcome_token_rewards(jnp.array([1.0, -1.0, 0.5, 2.0]), mask)
  rewards = rewards + jnp.where(mask, 0.1 * jax.random.normal(k1, mask.shape), 0.0)  # dense shaping
  values = jax.random.normal(k2, mask.shape)
  out = gae(rewards, values, mask, gamma=0.9, lam=0.8)
  want = _naive_gae(np.asarray(rewards, np.float64), np.asarray(values, np.float64), np.asarray(mask), 0.9, 0.8)
  # f32 recursion over T = 6 steps vs f64, terms |r|, |V| up to ~3: ~T u sum|terms| ~ 1e-6 (plus ulps
  # of |returns| ~3 below); measured <= 2.3e-7 over 5 seeds
  np.testing.assert_allclose(out.adv_BR, want, rtol=1e-5, atol=3e-6)
  np.testing.assert_allclose(out.returns_BR, np.where(np.asarray(mask), want + np.asarray(values), 0.0),
                             rtol=1e-5, atol=3e-6)


def test_outcome_token_rewards_on_last_token():
  mask = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], bool)
  got = outcome_token_rewards(jnp.array([2.0, -1.0, 5.0]), mask)
  np.testing.assert_array_equal(np.asarray(got), [[0, 2.0, 0], [0, 0, -1.0], [0, 0, 0]])


def test_masked_whiten():
  x = jnp.array([[1.0, 3.0], [5.0, 99.0]])
  mask = jnp.array([[1, 1], [1, 0]], bool)
  # valid [1, 3, 5]: mean 3, population std sqrt(8/3).
  want = np.array([[-2, 0], [2, 0]]) / (np.sqrt(8 / 3) + 1e-6)
  np.testing.assert_allclose(masked_whiten(x, mask), want, rtol=1e-6)


def test_clipped_value_loss_golden_and_gradient():
  v = jnp.array([[1.5, 0.9]])
  old = jnp.array([[1.0, 1.0]])
  ret = jnp.array([[2.0, 1.0]])
  mask = jnp.ones((1, 2), bool)
  # token 1: max((1.5-2)^2, (1.2-2)^2) = 0.64 (clip binds, no gradient); token 2: 0.01 (inside).
  # token_mean of 0.5 * [0.64, 0.01] = (0.32 + 0.005) / 2 = 0.1625.
  out = value_loss(v, old, ret, mask, clip=0.2)
  assert float(out.value()) == pytest.approx(0.1625, rel=1e-6)
  g = jax.grad(lambda vv: value_loss(vv, old, ret, mask, clip=0.2).value())(v)
  np.testing.assert_allclose(g, [[0.0, (0.9 - 1.0) / 2]], atol=1e-7)
  # No clip: 0.5 * (0.25 + 0.01) / 2 = 0.065.
  assert float(value_loss(v, old, ret, mask, clip=None).value()) == pytest.approx(0.065, rel=1e-6)


def test_valid_mask_excludes_filtered_answers():
  # Group [1, 0, 1, (filtered 7)]: valid n = 3, mean 2/3, centred [1/3, -2/3, 1/3];
  # unbiased var = (1/9 + 4/9 + 1/9) / 2 = 1/3.
  r = jnp.array([1.0, 0.0, 1.0, 7.0])
  valid = jnp.array([True, True, True, False])
  c = np.array([1 / 3, -2 / 3, 1 / 3, 0.0])
  np.testing.assert_allclose(compute_advantages(r, 4, get_preset("dr_grpo"), valid_B=valid), c, atol=1e-6)
  np.testing.assert_allclose(compute_advantages(r, 4, get_preset("grpo"), valid_B=valid),
                             c / (np.sqrt(1 / 3) + 1e-6), rtol=1e-5, atol=1e-7)
  # RLOO: 1 - (0 + 1)/2 = 0.5; 0 - (1 + 1)/2 = -1; 0.5; filtered -> 0.
  np.testing.assert_allclose(compute_advantages(r, 4, get_preset("rloo"), valid_B=valid), [0.5, -1.0, 0.5, 0.0],
                             atol=1e-6)
  # One valid answer left in a group: no baseline, A = 0.
  lone = compute_advantages(jnp.array([1.0, 5.0]), 2, get_preset("rloo"), valid_B=jnp.array([True, False]))
  np.testing.assert_array_equal(np.asarray(lone), [0.0, 0.0])
  # Global whitening skips the filtered row: [1, 0, 1] -> mean 2/3, same std as above.
  got = compute_advantages(r, 2, get_preset("reinforce_pp"), valid_B=valid)
  np.testing.assert_allclose(got, c / (np.sqrt(1 / 3) + 1e-6), rtol=1e-5, atol=1e-7)
