"""For EVERY preset: jax.grad of the loss w.r.t. the logits == the master equation's gradient.

The expected gradient (docs/objectives.md eq. 9.1) is written out in logit space
(grad_z log pi(y) = e_y - pi), loss = -J:

    dL/dz_{i,t} = -lambda_{i,t} A_{i,t} [ W_{i,t} (e_y - pi) - kappa ( mu*W_v - pi sum_v mu_v W_v ) ]

with W from the master table (objectives_reference.spec_weight, keyed by
method name with the papers' constants) and lambda from each method's
objective. The batch mixes in-range and out-of-range ratios (asserted
below), both advantage signs, ragged lengths and a pure-padding row.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives_reference as ref
from jaxrl_llm.objectives import PRESETS, centering_exact, get_preset, policy_loss, ratios

# lambda of each method's objective (docs/objectives.md sections 5 and 10). Where the paper
# states no normaliser (SAO, DPPO: a bare sum; Score Centering: sum over
# answers) the preset's documented choice is used.
SPEC_LAMBDA = {
    "reinforce": "seq_mean_token_sum", "grpo": "seq_mean_token_mean", "dr_grpo": "constant",
    "dapo": "token_mean", "gspo": "seq_mean_token_mean", "gspo_token": "seq_mean_token_mean",
    "cispo": "token_mean", "decoupled_ppo": "seq_mean_token_mean", "token_tis": "seq_mean_token_mean",
    "icepop": "seq_mean_token_mean", "seq_tis": "seq_mean_token_mean", "seq_mis": "seq_mean_token_mean",
    "geo_mis": "seq_mean_token_mean", "scalerl_dapo": "token_mean", "scalerl_gspo": "seq_mean_token_mean",
    "scalerl_cispo": "token_mean", "pipelinerl": "seq_mean_token_sum", "sao": "token_mean",
    "topr": "seq_mean_token_sum", "dppo_tv": "token_mean", "dppo_kl": "token_mean",
    "trm": "seq_mean_token_sum", "trm_avg": "seq_mean_token_sum", "score_centering": "seq_mean_token_sum",
    "tis_sc": "seq_mean_token_sum", "mis_sc": "seq_mean_token_sum", "ppo": "token_mean",
    "ppo_dual_clip": "token_mean", "rloo": "seq_mean_token_sum", "reinforce_pp": "token_mean",
    "reinforce_pp_baseline": "token_mean",
}

BATCH = ref.make_batch(0)


def _np_quantities(b):
  lp_full = ref.log_softmax64(b["z"])
  prox_full = ref.log_softmax64(b["z_prox"])
  behav_full = ref.log_softmax64(b["z_behav"])
  y = np.asarray(b["y"])
  q = dict(lp_full=lp_full, behav_full=behav_full, p=np.exp(lp_full), mu=np.exp(behav_full),
           m=np.asarray(b["mask"]), y=y)
  lpy, proxy, behavy = ref.take(lp_full, y), ref.take(prox_full, y), ref.take(behav_full, y)
  q.update(pi_y=np.exp(lpy), mu_y=np.exp(behavy), r=np.exp(lpy - proxy), c=np.exp(proxy - behavy),
           rho=np.exp(lpy - behavy), kl=ref.full_kl(behav_full, lp_full))
  return q


Q = _np_quantities(BATCH)


def expected_grad(name, adv):
  q = Q
  a = np.asarray(adv, np.float64)
  w = ref.spec_weight(name, q["r"], q["c"], q["rho"], a, q["m"], q["pi_y"], q["mu_y"], q["kl"])
  w = np.where(q["m"], w, 0.0)
  lam = ref.ref_lambda(q["m"], SPEC_LAMBDA[name])
  e_y = np.eye(ref.V)[q["y"]]
  g = -(lam * a * w)[..., None] * (e_y - q["p"])
  if name in ref.KAPPA_ONE:
    wv = ref.spec_vocab_weight(name, np.exp(q["lp_full"] - q["behav_full"]))
    mw = q["mu"] * wv
    g = g + (lam * a)[..., None] * (mw - q["p"] * mw.sum(-1, keepdims=True))
  return g


def library_grad(cfg, adv):
  b = BATCH
  prox = jnp.take_along_axis(jax.nn.log_softmax(b["z_prox"]), b["y"][..., None], -1)[..., 0]
  behav_full = jax.nn.log_softmax(b["z_behav"])
  behav = jnp.take_along_axis(behav_full, b["y"][..., None], -1)[..., 0]
  kl = jnp.asarray(Q["kl"], jnp.float32) if cfg.needs_token_kl else None

  def loss(z):
    logp_full = jax.nn.log_softmax(z)
    logp = jnp.take_along_axis(logp_full, b["y"][..., None], -1)[..., 0]
    cent = centering_exact(logp_full, behav_full, cfg) if cfg.needs_centering else None
    out = policy_loss(logp, prox, behav, adv, b["mask"], cfg, norms=None, centering=cent, kl_BR=kl)
    return out.loss.value()

  return jax.grad(loss)(b["z"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_grad_equals_master_equation(name):
  got = library_grad(get_preset(name), BATCH["adv"])
  want = expected_grad(name, BATCH["adv"])
  assert np.abs(want).max() > 1e-3  # the method moves something on this batch
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("name", ["ppo", "sao", "gspo_token", "dapo", "ppo_dual_clip"])
def test_grad_with_per_token_advantages(name):
  # GAE-style advantages that change sign inside an answer.
  noise = np.asarray(jax.random.normal(jax.random.key(7), (ref.B, ref.T)))
  adv = (ref.SEQ_ADV[:, None] + 1.5 * noise).astype(np.float32)
  assert ((adv > 0) & Q["m"]).any() and ((adv < 0) & Q["m"]).any()
  got = library_grad(get_preset(name), jnp.asarray(adv))
  np.testing.assert_allclose(np.asarray(got), expected_grad(name, adv), rtol=2e-4, atol=2e-6)


def test_batch_mixes_in_and_out_of_range():
  """Without this, the gradient tests above could pass with every mask inactive."""
  q, m = Q, Q["m"]
  a = np.asarray(BATCH["adv"])

  def both(flag):
    return (flag & m).any() and (~flag & m).any()

  assert both((q["r"] < 0.8) | (q["r"] > 1.28))  # GRPO/DAPO/CISPO clips bind and don't
  assert both(ref.ppo_m(q["r"], a, 0.8, 1.2) == 0)  # sign-aware mask active on some tokens
  assert both((q["c"] < 0.5) | (q["c"] > 5))  # IcePop
  assert both(q["c"] > 2) and both(q["rho"] > 2) and both(q["rho"] > 1.02)  # TIS / PipelineRL
  assert both((q["rho"] < 0.7) | (q["rho"] > 6))  # SAO
  rows = m.any(1)
  s = ref.seq_geo(q["r"], m)[:, 0]
  in_gspo = (s > 1 - 3e-4) & (s < 1 + 4e-4)
  assert (in_gspo & rows).any() and (~in_gspo & rows).any()
  cb = ref.seq_geo(q["c"], m)[:, 0]
  in_geo = (cb >= 0.9998) & (cb <= 1.0002)
  assert (in_geo & rows).any() and (~in_geo & rows).any()
  ci = ref.seq_prod(q["c"], m)[:, 0]
  assert ((ci <= 2) & rows).any() and ((ci > 2) & rows).any()  # Seq-MIS keeps and drops
  kl_max = np.where(m, q["kl"], -np.inf).max(1)
  assert ((kl_max <= 0.05) & rows).any() and ((kl_max > 0.05) & rows).any()  # TRM
  tv = np.abs(q["mu_y"] - q["pi_y"])
  assert both(tv > 0.15)  # DPPO-TV divergence test binds somewhere
  assert (a[m] > 0).any() and (a[m] < 0).any()


def _literal_objective(name, logp, prox, behav, a, m):
  """The papers' own surrogates J per token (docs/objectives.md sections 2-4), written with jnp."""
  sg = jax.lax.stop_gradient
  r, c, rho = jnp.exp(logp - prox), jnp.exp(prox - behav), jnp.exp(logp - behav)

  def ppo(x, lo, hi):
    return jnp.minimum(x * a, jnp.clip(x, lo, hi) * a)

  if name == "grpo":
    return ppo(r, 0.8, 1.2)
  if name == "ppo_dual_clip":
    return jnp.where(a < 0, jnp.maximum(ppo(r, 0.8, 1.2), 3.0 * a), ppo(r, 0.8, 1.2))
  if name == "cispo":
    return sg(jnp.clip(r, 0.8, 1.28)) * a * logp
  if name == "gspo_token":
    n = jnp.maximum(jnp.sum(m, 1), 1)
    s = jnp.exp(ratios.gspo_token_log_ratio(logp, jnp.sum(jnp.where(m, logp - prox, 0.0), 1) / n))
    return ppo(s, 1 - 3e-4, 1 + 4e-4)
  if name == "token_tis":
    return jnp.minimum(c, 2.0) * ppo(r, 0.8, 1.2)
  if name == "pipelinerl":
    return sg(jnp.minimum(rho, 1.02)) * a * logp
  raise AssertionError(name)


@pytest.mark.parametrize("name", ["grpo", "ppo_dual_clip", "cispo", "gspo_token", "token_tis", "pipelinerl"])
def test_grad_equals_autodiff_of_the_papers_surrogate(name):
  """Second, naive reference: jax.grad of min(rA, clip(r)A) etc. equals our gradient."""
  b = BATCH
  y = b["y"][..., None]
  prox = jnp.take_along_axis(jax.nn.log_softmax(b["z_prox"]), y, -1)[..., 0]
  behav = jnp.take_along_axis(jax.nn.log_softmax(b["z_behav"]), y, -1)[..., 0]
  lam = jnp.asarray(ref.ref_lambda(Q["m"], SPEC_LAMBDA[name]), jnp.float32)
  m = b["mask"]

  def literal_loss(z):
    logp = jnp.take_along_axis(jax.nn.log_softmax(z), y, -1)[..., 0]
    j = _literal_objective(name, jnp.where(m, logp, 0.0), jnp.where(m, prox, 0.0), jnp.where(m, behav, 0.0),
                           b["adv"], m)
    return -jnp.sum(jnp.where(m, lam * j, 0.0))

  want = np.asarray(jax.grad(literal_loss)(b["z"]))
  np.testing.assert_allclose(np.asarray(library_grad(get_preset(name), b["adv"])), want, rtol=2e-4, atol=2e-6)
