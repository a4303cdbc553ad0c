"""docs/objectives.md section 2's tables, exactly: GRPO's four quadrants, DAPO vs CISPO, on-policy invariance.

d loss / d log pi(y_t) = -lambda A W (loss = -J), so the gradient w.r.t. the
per-token log-prob reads off W directly.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives_reference as ref
from jaxrl_llm.objectives import PRESETS, centering_exact, get_preset, policy_loss

PROX = math.log(0.3)  # pi_prox(y) = 0.3 for every token; mu = pi_prox (c = 1)


def grad_wrt_logp(cfg, r, adv):
  """One token per row, token_mean over n rows: dL/dlogp = -A W / n."""
  r = jnp.asarray(r, jnp.float32)[:, None]
  logp = jnp.log(r) + PROX
  prox = jnp.full_like(logp, PROX)
  adv = jnp.asarray(adv, jnp.float32)
  mask = jnp.ones(logp.shape, bool)

  def loss(lp):
    return policy_loss(lp, prox, prox, adv, mask, cfg, norms=None).loss.value()

  return np.asarray(jax.jit(jax.grad(loss))(logp))[:, 0]


def test_grpo_four_quadrants():
  # docs/objectives.md eq. 2.4 table, eps = 0.2: rows (A, r) -> gradient flows or is 0.
  adv = [1.0, 1.0, -1.0, -1.0]
  r = [1.5, 0.6, 1.5, 0.6]
  # weights: A>0 & r>1.2: clipped (0); A>0 & r<0.8: flows (W = r = 0.6);
  #          A<0 & r>1.2: flows (W = 1.5); A<0 & r<0.8: clipped (0).
  w = [0.0, 0.6, 1.5, 0.0]
  g = grad_wrt_logp(get_preset("grpo", aggregation="token_mean"), r, adv)
  np.testing.assert_allclose(g, -np.array(adv) * np.array(w) / 4, rtol=1e-6, atol=1e-7)


DAPO_CISPO_CASES = [  # docs/objectives.md section 2 table, bounds [0.8, 1.28]: (A sign, r, DAPO W, CISPO W)
    (+1.0, 1.1, 1.1, 1.1),
    (+1.0, 1.5, 0.0, 1.28),
    (+1.0, 0.6, 0.6, 0.8),
    (-1.0, 0.6, 0.0, 0.8),
    (-1.0, 3.0, 3.0, 1.28),
]


@pytest.mark.parametrize("method,col", [("dapo", 2), ("cispo", 3)])
def test_dapo_vs_cispo_table(method, col):
  adv = [c[0] for c in DAPO_CISPO_CASES]
  r = [c[1] for c in DAPO_CISPO_CASES]
  w = np.array([c[col] for c in DAPO_CISPO_CASES])
  g = grad_wrt_logp(get_preset(method), r, adv)  # both are token_mean: lambda = 1/5
  np.testing.assert_allclose(g, -np.array(adv) * w / 5, rtol=1e-6, atol=1e-7)


def test_dual_clip_bounds_negative_advantage():
  # Dual-clip c = 3 (Ye et al.): A < 0 and r > 3 -> masked; r = 2.5 still flows; A > 0 unaffected.
  g = grad_wrt_logp(get_preset("ppo_dual_clip"), [4.0, 2.5, 1.1], [-1.0, -1.0, 1.0])
  np.testing.assert_allclose(g, -np.array([-1.0, -1.0, 1.0]) * np.array([0.0, 2.5, 1.1]) / 3, rtol=1e-6)


def test_cispo_absolute_cap_convention():
  # TRL / ScaleRL convention: sg(min(r, cap)), no lower bound.
  cfg = get_preset("cispo", truncate_bounds="absolute", truncate_cap=5.0)
  g = grad_wrt_logp(cfg, [0.3, 7.0, 2.0], [1.0, 1.0, -1.0])
  np.testing.assert_allclose(g, -np.array([1.0, 1.0, -1.0]) * np.array([0.3, 5.0, 2.0]) / 3, rtol=1e-6)


def test_table_metrics_clip_fractions():
  b = DAPO_CISPO_CASES
  r = jnp.asarray([c[1] for c in b], jnp.float32)[:, None]
  adv = jnp.asarray([c[0] for c in b], jnp.float32)
  prox = jnp.full(r.shape, PROX)
  out = policy_loss(jnp.log(r) + PROX, prox, prox, adv, jnp.ones(r.shape, bool), get_preset("dapo"), norms=None)
  # clip_high: A>0 & r>1.28 -> case 2 only (1/5); clip_low: A<0 & r<0.8 -> case 4 only (1/5).
  assert float(out.metrics["trust/clip_high_frac"].value()) == pytest.approx(0.2)
  assert float(out.metrics["trust/clip_low_frac"].value()) == pytest.approx(0.2)
  assert float(out.extrema["ratio/r_max"]) == pytest.approx(3.0, rel=1e-6)
  assert float(out.extrema["ratio/r_min"]) == pytest.approx(0.6, rel=1e-6)
  # mean r = (1.1 + 1.5 + 0.6 + 0.6 + 3.0) / 5 = 1.36; c = rho / r = 1 here.
  assert float(out.metrics["ratio/r_mean"].value()) == pytest.approx(1.36, rel=1e-6)
  assert float(out.metrics["ratio/c_mean"].value()) == pytest.approx(1.0)
  # mean |W| = (1.1 + 0 + 0.6 + 0 + 3.0) / 5 = 0.94.
  assert float(out.metrics["weight/abs_mean"].value()) == pytest.approx(0.94, rel=1e-6)
  # loss value = -sum A W / 5 = -(1.1 + 0.6 - 3.0) / 5 = 0.26.
  assert float(out.loss.value()) == pytest.approx(0.26, rel=1e-5)
  assert float(out.counts["tokens"]) == 5.0


ON_POLICY = ref.make_batch(3)
_BASELINES = {}


def _on_policy_grad(c, wrt_logits: bool):
  """On-policy gradient of the loss w.r.t. the logits, or w.r.t. log pi(y).

  For kappa = 0 the loss depends on the logits only through log pi(y), so equal
  gradients w.r.t. log pi(y) mean equal gradients w.r.t. the logits (cheaper);
  kappa = 1 needs the logits (the centering term uses the full distribution).
  """
  b = ON_POLICY
  y = b["y"][..., None]
  kl = jnp.zeros(b["mask"].shape) if c.needs_token_kl else None

  def loss_lp(logp, cent=None):
    same = jax.lax.stop_gradient(logp)
    return policy_loss(logp, same, same, b["adv"], b["mask"], c, norms=None, centering=cent,
                       kl_BR=kl).loss.value()

  if not wrt_logits:
    return np.asarray(jax.grad(loss_lp)(jnp.take_along_axis(jax.nn.log_softmax(b["z"]), y, -1)[..., 0]))

  def loss(z):
    logp_full = jax.nn.log_softmax(z)
    logp = jnp.take_along_axis(logp_full, y, -1)[..., 0]
    cent = centering_exact(logp_full, jax.lax.stop_gradient(logp_full), c) if c.needs_centering else None
    return loss_lp(logp, cent)

  return np.asarray(jax.grad(loss)(b["z"]))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_on_policy_equals_reinforce(name):
  """pi_theta = pi_prox = mu: every ratio is 1 and every preset's gradient is REINFORCE's."""
  cfg = get_preset(name)
  wrt_logits = cfg.needs_centering
  key = (cfg.aggregation, cfg.adv_level, wrt_logits)
  if key not in _BASELINES:
    base = get_preset("reinforce", aggregation=cfg.aggregation, adv_level=cfg.adv_level)
    _BASELINES[key] = _on_policy_grad(base, wrt_logits)
  want = _BASELINES[key]
  assert np.abs(want).max() > 1e-3
  np.testing.assert_allclose(_on_policy_grad(cfg, wrt_logits), want, rtol=1e-5, atol=1e-7)
