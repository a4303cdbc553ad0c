"""KL estimators, entropy, ratios and the mask / truncation primitives."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives_reference as ref
from jaxrl_llm.objectives import (entropy_from_logits, fold_kl_into_rewards, full_token_kl, get_preset, kl_penalty,
                                  master_weights, policy_loss)
from jaxrl_llm.objectives import ratios, weights


def test_kl_estimators_golden():
  # pi = 0.5, ref = 0.25: delta = ln(0.25/0.5) = -ln 2.
  lp, rp = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
  ln2 = math.log(2)
  assert float(kl_penalty(lp, rp, "k1")[0, 0]) == pytest.approx(ln2, rel=1e-6)
  assert float(kl_penalty(lp, rp, "k2")[0, 0]) == pytest.approx(0.5 * ln2 ** 2, rel=1e-6)
  assert float(kl_penalty(lp, rp, "k3")[0, 0]) == pytest.approx(0.5 + ln2 - 1, rel=1e-5)  # e^d - d - 1
  with pytest.raises(ValueError, match="kind='k4' is invalid: allowed KL estimators are"):
    kl_penalty(lp, rp, "k4")


def test_k1_and_k3_are_unbiased_by_enumeration():
  pi = np.array([0.1, 0.2, 0.3, 0.4])
  rf = np.array([0.25, 0.25, 0.4, 0.1])
  kl = float(np.sum(pi * np.log(pi / rf)))
  lp = jnp.log(jnp.asarray(pi, jnp.float32))[None]
  rp = jnp.log(jnp.asarray(rf, jnp.float32))[None]
  for kind in ("k1", "k3"):
    est = float(np.sum(pi * np.asarray(kl_penalty(lp, rp, kind))[0]))
    assert est == pytest.approx(kl, rel=1e-5)


def test_fold_kl_into_rewards():
  lp = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.9]]))
  rp = jnp.log(jnp.array([[0.25, 0.5], [0.5, 0.1]]))
  mask = jnp.array([[1, 1], [1, 0]], bool)
  got = fold_kl_into_rewards(jnp.array([1.0, 1.0]), lp, rp, mask, coef=0.1)
  # row 0: k1 = ln 2 + 0 -> 1 - 0.1 ln 2; row 1: second token masked -> k1 sum 0.
  np.testing.assert_allclose(got, [1 - 0.1 * math.log(2), 1.0], rtol=1e-6)


def test_entropy_from_logits():
  z = jnp.array([[[0.0, 1.0, -jnp.inf, 2.0]]])
  p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
  assert float(entropy_from_logits(z)[0, 0]) == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-6)


def test_log_ratio_clamp_and_sequence_ratios():
  lr = ratios.clamped_log_ratio(jnp.array([0.0, -jnp.inf, 50.0]), jnp.array([-1.0, 0.0, 0.0]), log_clamp=20.0)
  np.testing.assert_allclose(lr, [1.0, -20.0, 20.0])
  log_x = jnp.log(jnp.array([[2.0, 0.5, 4.0], [3.0, 9.0, 9.0]]))
  mask = jnp.array([[1, 1, 1], [1, 0, 0]], bool)
  # products: 2 * 0.5 * 4 = 4; 3. geometric means: 4^(1/3); 3.
  np.testing.assert_allclose(jnp.exp(ratios.seq_log_product(log_x, mask)), [4.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(jnp.exp(ratios.seq_log_geomean(log_x, mask)), [4 ** (1 / 3), 3.0], rtol=1e-6)
  with pytest.raises(ValueError, match="log_clamp=0"):
    ratios.clamped_log_ratio(jnp.zeros(1), jnp.zeros(1), log_clamp=0)


def test_gspo_token_form_value_and_gradient():
  logp = jnp.log(jnp.array([[0.2, 0.5]]))
  seq = jnp.array([0.3])
  val = ratios.gspo_token_log_ratio(logp, seq)
  np.testing.assert_allclose(val, [[0.3, 0.3]], rtol=1e-6)
  g = jax.grad(lambda lp: jnp.sum(jnp.exp(ratios.gspo_token_log_ratio(lp, seq)) * jnp.array([[1.0, 2.0]])))(logp)
  # d/dlogp_t [s_i * exp(logp_t - sg(logp_t)) A_t] = s_i A_t with s_i = e^0.3.
  np.testing.assert_allclose(g, math.exp(0.3) * np.array([[1.0, 2.0]]), rtol=1e-6)


def test_binary_divergences_and_full_kl():
  mu, pi = np.array([0.9, 0.02, 0.5]), np.array([0.7, 0.003, 0.5])
  np.testing.assert_allclose(weights.binary_tv(jnp.log(pi), jnp.log(mu)), np.abs(mu - pi), rtol=1e-5)
  np.testing.assert_allclose(weights.binary_kl(jnp.log(jnp.asarray(mu, jnp.float32)),
                                               jnp.log(jnp.asarray(pi, jnp.float32))),
                             ref.binary_kl(mu, pi), rtol=1e-4, atol=1e-7)
  p = jax.nn.log_softmax(jnp.array([[[0.0, 1.0, 2.0]]]))
  q = jax.nn.log_softmax(jnp.array([[[1.0, -1.0, 0.0]]]))
  np.testing.assert_allclose(full_token_kl(p, q), ref.full_kl(ref.log_softmax64(np.asarray(p)),
                                                              ref.log_softmax64(np.asarray(q))), rtol=1e-5)


def test_trm_keep_max_mean_and_both():
  kl = jnp.array([[0.01, 0.06, 0.0], [0.001, 0.001, 9.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)  # row 1's 9.0 is padding
  np.testing.assert_array_equal(weights.trm_keep(kl, mask, max_delta=0.05, mean_delta=None), [False, True])
  # means: 0.07/3 = 0.0233, 0.001.
  np.testing.assert_array_equal(weights.trm_keep(kl, mask, max_delta=None, mean_delta=0.03), [True, True])
  np.testing.assert_array_equal(weights.trm_keep(kl, mask, max_delta=0.1, mean_delta=0.002), [False, True])


def test_ppo_and_truncation_primitives():
  x = jnp.array([1.5, 0.6, 1.5, 0.6, 4.0])
  a = jnp.array([1.0, 1.0, -1.0, -1.0, -1.0])
  pw = weights.ppo_weight(x, a, eps_low=0.2, eps_high=0.2, dual_clip_c=3.0)
  np.testing.assert_allclose(pw.weight, [0.0, 0.6, 1.5, 0.0, 0.0])
  np.testing.assert_array_equal(pw.dual_clip, [False, False, False, False, True])
  tw = weights.truncate_weight(x, lower=0.8, upper=1.28)
  np.testing.assert_allclose(tw.weight, [1.28, 0.8, 1.28, 0.8, 1.28])


def test_padding_with_inf_never_leaks():
  logp = jnp.array([[-0.5, -jnp.inf]])
  mask = jnp.array([[True, False]])
  cfg = get_preset("decoupled_ppo")
  g = jax.grad(lambda lp: policy_loss(lp, lp - 0.1, jnp.full_like(lp, -jnp.inf), jnp.ones(1), mask, cfg,
                                      norms=None).loss.value())(logp)
  assert np.all(np.isfinite(np.asarray(g)))
  assert float(g[0, 1]) == 0.0


def test_kl_in_loss_and_entropy_bonus_gradients():
  """loss = sum lambda [-A W + beta k3 - coef H]: d/dlogp adds beta (1 - e^{ref - logp}) lambda,
  d/dH is -coef lambda (token_mean over 3 tokens: lambda = 1/3)."""
  cfg = get_preset("dapo", kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01)
  logp = jnp.log(jnp.array([[0.5, 0.2, 0.7]]))
  ref_lp = jnp.log(jnp.array([[0.25, 0.2, 0.9]]))
  ent = jnp.array([[1.0, 2.0, 0.5]])
  adv = jnp.array([1.0])
  mask = jnp.ones((1, 3), bool)

  @jax.jit
  def f(lp, h):
    return policy_loss(lp, lp, lp, adv, mask, cfg, norms=None, ref_logp_BR=ref_lp, entropy_BR=h).loss.value()

  g_lp, g_h = jax.grad(f, argnums=(0, 1))(logp, ent)
  # On-policy r = 1 inside the clip: W = 1, so -A W / 3 from the policy term.
  ratio = np.array([0.5, 1.0, 0.9 / 0.7])  # ref / pi
  want = (-1.0 + 0.1 * (1 - ratio)) / 3
  np.testing.assert_allclose(g_lp, want[None], rtol=1e-5)
  np.testing.assert_allclose(g_h, np.full((1, 3), -0.01 / 3), rtol=1e-6)


def test_bf16_log_probs_give_float32_weights():
  cfg = get_preset("token_tis")
  lp = jnp.log(jnp.array([[0.5, 0.25]])).astype(jnp.bfloat16)
  prox = (lp.astype(jnp.float32) - 0.1).astype(jnp.bfloat16)
  mw = jax.jit(master_weights, static_argnums=5)(lp, prox, prox - 1.0, jnp.ones((1, 2)), jnp.ones((1, 2), bool),
                                                 cfg)
  assert mw.weight_BR.dtype == jnp.float32
  # c = e^1 > C = 2 -> f = 2; r = e^{0.1} inside [0.8, 1.2] (bf16 inputs, ratio in float32).
  r = np.exp(np.asarray(lp, np.float32) - np.asarray(prox, np.float32))
  assert np.all((r > 0.8) & (r < 1.2))
  np.testing.assert_allclose(mw.weight_BR, 2 * r, rtol=1e-6)
