"""The Bradley-Terry loss and its gradient against the formula written out, the pairwise metrics by
hand, and a head on fixed features that separates a separable set."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.reward_model.loss import PairStats, bradley_terry_loss, pair_stats


def _scores():
  k1, k2 = jax.random.split(jax.random.key(0))
  r_c = jax.random.normal(k1, (6,), jnp.float32)
  r_r = jax.random.normal(k2, (6,), jnp.float32)
  margin = jnp.asarray([0.0, 0.5, 1.0, -0.3, 0.0, 2.0], jnp.float32)
  weight = jnp.asarray([1, 1, 1, 1, 1, 0], jnp.float32)  # the last row is padding
  return r_c, r_r, margin, weight


@pytest.mark.parametrize("coef", [0.0, 0.01, 0.5])
def test_loss_and_gradient_match_the_formula(coef):
  r_c, r_r, m, w = _scores()
  c, r, m_, w_ = (np.asarray(a, np.float64) for a in (r_c, r_r, m, w))
  n = w_.sum()  # 5 real pairs
  sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
  d = c - r - m_
  # L = sum_b w_b [ -log sigmoid(r_c - r_r - m) + coef (r_c + r_r)^2 ] / sum_b w_b
  want = np.sum(w_ * (-np.log(sig(d)) + coef * (c + r) ** 2)) / n
  # dL/dr_c = w [ -(1 - sigmoid(d)) + 2 coef (r_c + r_r) ] / n
  # dL/dr_r = w [ (1 - sigmoid(d)) + 2 coef (r_c + r_r) ] / n
  want_dc = w_ * (-(1 - sig(d)) + 2 * coef * (c + r)) / n
  want_dr = w_ * ((1 - sig(d)) + 2 * coef * (c + r)) / n

  loss = bradley_terry_loss(r_c, r_r, m, w, center_coef=coef)
  assert float(loss.denominator) == 5.0
  np.testing.assert_allclose(float(loss.value()), want, rtol=1e-6)
  g_c, g_r = jax.grad(lambda a, b: bradley_terry_loss(a, b, m, w, center_coef=coef).value(), argnums=(0, 1))(r_c, r_r)
  np.testing.assert_allclose(np.asarray(g_c), want_dc, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.asarray(g_r), want_dr, rtol=1e-5, atol=1e-7)
  assert g_c[5] == 0 and g_r[5] == 0  # padding rows get no gradient
  if coef == 0:  # without centring the loss sees differences only
    np.testing.assert_allclose(np.asarray(g_c), -np.asarray(g_r), rtol=1e-6)


def test_loss_of_batches_adds_up_exactly():
  r_c, r_r, m, w = _scores()
  whole = bradley_terry_loss(r_c, r_r, m, w, center_coef=0.1)
  parts = [bradley_terry_loss(r_c[s], r_r[s], m[s], w[s], center_coef=0.1) for s in (slice(0, 2), slice(2, 6))]
  total = parts[0] + parts[1]
  np.testing.assert_allclose(float(total.value()), float(whole.value()), rtol=1e-6)


def test_pair_metrics_by_hand():
  # deltas 2, -1, 0.5, 0 (a tie is wrong), and a padding row that must not count.
  r_c = jnp.asarray([2.0, 0.0, 1.5, 0.3, 9.0])
  r_r = jnp.asarray([0.0, 1.0, 1.0, 0.3, -9.0])
  w = jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0])
  s = pair_stats(r_c, r_r, w).summary()
  sig = lambda x: 1.0 / (1.0 + np.exp(-x))  # noqa: E731
  assert s["accuracy"] == 0.5  # deltas 2 and 0.5 of 4
  np.testing.assert_allclose(s["margin"], (2 - 1 + 0.5 + 0) / 4, rtol=1e-6)
  np.testing.assert_allclose(s["reward_mean"], (2 + 1 + 2.5 + 0.6) / 2 / 4, rtol=1e-6)
  # Confidences max(p, 1 - p): sigmoid(2) = 0.881 (bin 7 of [0.5, 1] in 0.05 steps, correct),
  # sigmoid(1) = 0.731 (bin 4, wrong), sigmoid(0.5) = 0.622 (bin 2, correct), 0.5 (bin 0, wrong):
  # one pair per bin, so ECE = mean |correct - conf|.
  conf = np.array([sig(2.0), sig(1.0), sig(0.5), 0.5])
  correct = np.array([1.0, 0.0, 1.0, 0.0])
  np.testing.assert_allclose(s["ece"], np.mean(np.abs(correct - conf)), rtol=1e-5)
  stats = pair_stats(r_c, r_r, w)
  np.testing.assert_array_equal(np.nonzero(np.asarray(stats.bin_n_K))[0], [0, 2, 4, 7])
  # Two batches add up to the whole.
  halves = pair_stats(r_c[:2], r_r[:2], w[:2]) + pair_stats(r_c[2:], r_r[2:], w[2:])
  for k, v in halves.summary().items():
    np.testing.assert_allclose(v, s[k], rtol=1e-6)


def test_ece_is_zero_when_calibrated_and_large_when_overconfident():
  # 100 pairs with delta = log 3 (p = 0.75): calibrated when 3 of 4 are right.
  d = jnp.full((100,), float(np.log(3.0)))
  sign = jnp.where(jnp.arange(100) % 4 == 0, -1.0, 1.0)  # every 4th pair is wrong
  s = pair_stats(sign * d, jnp.zeros(100), jnp.ones(100)).summary()
  assert s["accuracy"] == 0.75
  assert s["ece"] < 1e-6
  # The same accuracy at delta = 5 (p = 0.993): ECE = 0.993 - 0.75.
  s = pair_stats(sign * 5.0, jnp.zeros(100), jnp.ones(100)).summary()
  # ECE ~0.24 from an f32 mean of 100 confidences ~0.993 (summed in an order XLA:CPU picks per
  # CPU): bounded by 100 * u * 0.993 ~ 6e-6; measured 1.3e-6 (deterministic inputs)
  np.testing.assert_allclose(s["ece"], 1 / (1 + np.exp(-5.0)) - 0.75, rtol=1e-5, atol=1.2e-5)


def test_a_linear_head_separates_a_separable_set():
  """Fixed features with a gold direction w*: chosen is the higher w* . x. Gradient descent on the
  Bradley-Terry loss alone (no trunk) reaches pairwise accuracy 1 on held-out pairs."""
  D, N = 16, 512
  k = jax.random.split(jax.random.key(3), 4)
  w_star = jax.random.normal(k[0], (D,))
  x_a, x_b = jax.random.normal(k[1], (N, D)), jax.random.normal(k[2], (N, D))
  a_wins = (x_a @ w_star > x_b @ w_star)[:, None]
  x_c, x_r = jnp.where(a_wins, x_a, x_b), jnp.where(a_wins, x_b, x_a)
  held = slice(384, N)
  ones = jnp.ones((128,))

  def loss(w):
    return bradley_terry_loss(x_c[:384] @ w, x_r[:384] @ w, jnp.zeros(384), jnp.ones(384), center_coef=0.0).value()

  w = jnp.zeros((D,))
  grad = jax.jit(jax.grad(loss))
  for _ in range(300):
    w = w - 1.0 * grad(w)
  before = pair_stats(x_c[held] @ jnp.zeros(D), x_r[held] @ jnp.zeros(D), ones).summary()
  after = pair_stats(x_c[held] @ w, x_r[held] @ w, ones).summary()
  assert before["accuracy"] == 0.0  # all ties
  assert after["accuracy"] >= 0.98, after
  assert after["margin"] > 1.0


def test_shapes_must_agree():
  with pytest.raises(ValueError, match="one \\[B\\] shape"):
    bradley_terry_loss(jnp.zeros(3), jnp.zeros(4), jnp.zeros(3), jnp.ones(3), center_coef=0.0)
  assert isinstance(pair_stats(jnp.zeros(2), jnp.ones(2), jnp.ones(2)), PairStats)
