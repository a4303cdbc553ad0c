"""policy_loss's per-token factors (`PolicyLoss.tokens`) are the ones its loss used,
for every preset: each equals the formula of docs/objectives.md written out (objectives_reference,
keyed by method name), the loss's value is -sum lambda A W of those factors, and
jax.grad of the loss w.r.t. log pi_theta(y) is -lambda A W token by token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives_reference as ref
from jaxrl_llm.objectives import PRESETS, batch_norms, centering_exact, get_preset, policy_loss

# The normaliser each preset uses (docs/objectives.md section 5; test_master_gradient.SPEC_LAMBDA states the
# sources).
LAMBDA = {name: get_preset(name).aggregation for name in PRESETS}
B = ref.make_batch(0)


def _inputs():
  lp_full, prox_full, behav_full = (jax.nn.log_softmax(B[k]) for k in ("z", "z_prox", "z_behav"))
  take = lambda a: jnp.take_along_axis(a, B["y"][..., None], -1)[..., 0]  # noqa: E731
  return lp_full, behav_full, take(lp_full), take(prox_full), take(behav_full)


LP_FULL, BEHAV_FULL, LOGP, PROX, BEHAV = _inputs()
M = np.asarray(B["mask"])
R_ = np.exp(np.asarray(LOGP, np.float64) - np.asarray(PROX, np.float64))
C_ = np.exp(np.asarray(PROX, np.float64) - np.asarray(BEHAV, np.float64))
RHO = np.exp(np.asarray(LOGP, np.float64) - np.asarray(BEHAV, np.float64))
KL = ref.full_kl(ref.log_softmax64(B["z_behav"]), ref.log_softmax64(B["z"]))


def _run(cfg, logp=LOGP):
  cent = centering_exact(LP_FULL, BEHAV_FULL, cfg) if cfg.needs_centering else None
  kl = jnp.asarray(KL, jnp.float32) if cfg.needs_token_kl else None
  return policy_loss(logp, PROX, BEHAV, B["adv"], B["mask"], cfg, norms=None, centering=cent, kl_BR=kl)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_factors_are_the_spec_formulas_and_give_the_loss(name):
  cfg = get_preset(name)
  out = _run(cfg)
  f = {k: np.asarray(v) for k, v in out.tokens.arrays().items()}
  a = np.asarray(B["adv"], np.float64)
  if cfg.adv_level == "sequence":  # one advantage per answer: the masked mean (GSPO)
    a = np.broadcast_to((np.where(M, a, 0).sum(1) / np.maximum(M.sum(1), 1))[:, None], a.shape)
  a = np.where(M, a, 0.0)
  w = np.where(M, ref.spec_weight(name, R_, C_, RHO, a, M, np.exp(np.asarray(LOGP, np.float64)),
                                  np.exp(np.asarray(BEHAV, np.float64)), KL), 0.0)
  lam = ref.ref_lambda(M, LAMBDA[name])
  np.testing.assert_allclose(np.where(M, f["W"], 0.0), w, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(f["A"], a, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(f["lambda"], lam, rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(f["lambda_A_W"], lam * a * f["W"], rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(f["W"], f["T"] * f["f"], rtol=1e-6, atol=1e-9)  # W = f T
  if cfg.needs_prox:
    np.testing.assert_allclose(np.where(M, f["r"], 1.0), np.where(M, R_, 1.0), rtol=1e-5)
    np.testing.assert_allclose(np.where(M, f["c"], 1.0), np.where(M, C_, 1.0), rtol=1e-5)
  np.testing.assert_allclose(np.where(M, f["rho"], 1.0), np.where(M, RHO, 1.0), rtol=1e-5)
  if cfg.needs_centering:  # C_{i,t} = sum_v sg(mu_v W_v) log pi(v), the value the loss differentiates
    wv = ref.spec_vocab_weight(name, np.exp(ref.log_softmax64(B["z"]) - ref.log_softmax64(B["z_behav"])))
    c_ref = (np.exp(ref.log_softmax64(B["z_behav"])) * wv * ref.log_softmax64(B["z"])).sum(-1)
    np.testing.assert_allclose(f["C"], np.where(M, c_ref, 0.0), rtol=1e-4, atol=1e-5)
  else:
    assert not f["C"].any()
  # The loss's value is -sum lambda A W (the centering term's value is C - sg(C) = 0), kl/entropy off.
  assert cfg.kl_coef == 0 or cfg.kl_placement == "reward"
  # An f32 sum over the tokens of terms, each with its ulps of exp / log, that cancel to ~0.02 to 3:
  # the error scales with sum|terms| (~n u ~ 1e-6 of it), not with the sum; measured <= 3e-7 over 5 seeds
  np.testing.assert_allclose(float(out.loss.value()), -(lam * a * w).sum(), rtol=2e-5,
                             atol=1e-5 * np.abs(lam * a * w).sum())


@pytest.mark.parametrize("name", ["grpo", "icepop", "cispo", "gspo", "seq_mis", "topr", "dppo_kl", "trm",
                                  "dr_grpo", "pipelinerl"])
def test_grad_per_sampled_token_is_minus_lambda_a_w(name):
  # d loss / d log pi(y_t) = -lambda A W: the factors are the gradient's own coefficients.
  cfg = get_preset(name)
  g = np.asarray(jax.grad(lambda lp: _run(cfg, lp).loss.value())(LOGP))
  f = {k: np.asarray(v) for k, v in _run(cfg).tokens.arrays().items()}
  assert np.abs(f["lambda_A_W"]).max() > 1e-3
  np.testing.assert_allclose(g, -f["lambda_A_W"], rtol=1e-5, atol=1e-8)


def test_flags_mark_exactly_the_masked_tokens():
  cfg = get_preset("icepop", band_low=0.9, band_high=1.1)
  f = {k: np.asarray(v) for k, v in _run(cfg).tokens.arrays().items()}
  c = np.where(M, C_, 1.0)
  outside = M & ((c < 0.9) | (c > 1.1))
  assert outside.any() and (M & ~outside).any()
  np.testing.assert_array_equal(f["correction/masked"], outside)
  assert not f["W"][outside].any() and (f["f"][M & ~outside] > 0).all()


def test_lambda_uses_the_mini_batch_norms():
  # A micro-batch's lambda divides by the whole mini-batch's counts, as its loss does.
  cfg = get_preset("dapo")
  norms = batch_norms(B["mask"], 1, cfg)
  half = slice(0, 3)
  out = policy_loss(LOGP[half], PROX[half], BEHAV[half], B["adv"][half], B["mask"][half], cfg, norms=norms)
  np.testing.assert_allclose(np.asarray(out.tokens.lambda_BR), M[half] / M.sum(), rtol=1e-6)
