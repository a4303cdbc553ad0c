"""Score Centering (docs/objectives.md section 8): drift, zero mean, top-k approximation.

A prefix's expected update under mu is obtained by enumeration: row v of a
batch samples token v at the same prefix, and rows are weighted by mu(v).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.objectives import centering_exact, centering_topk, gather_topk, get_preset, policy_loss


@functools.partial(jax.jit, static_argnums=0)
def _expected_update(cfg, z_V, behav_logits_V, adv):
  """E_{y ~ mu}[ grad_z J ] at one prefix (J = -loss), by enumerating y over V.

  Row v samples token v; with lambda = 1/V (seq_mean_token_sum) and advantage
  A mu(v) V on row v (the loss is linear in A), the batch loss is
  -A E_{y~mu}[...] exactly.
  """
  assert cfg.aggregation == "seq_mean_token_sum"
  n_vocab = z_V.shape[0]
  behav_full = jnp.broadcast_to(jax.nn.log_softmax(behav_logits_V), (n_vocab, 1, n_vocab))
  y = jnp.arange(n_vocab)[:, None]
  mask = jnp.ones((n_vocab, 1), bool)
  behav = jnp.take_along_axis(behav_full, y[..., None], -1)[..., 0]
  adv_B = adv * jnp.exp(behav[:, 0]) * n_vocab

  def loss(z):
    logp_full = jnp.broadcast_to(jax.nn.log_softmax(z), (n_vocab, 1, n_vocab))
    logp = jnp.take_along_axis(logp_full, y[..., None], -1)[..., 0]
    cent = centering_exact(logp_full, behav_full, cfg) if cfg.needs_centering else None
    return policy_loss(logp, None, behav, adv_B, mask, cfg, norms=None, centering=cent).loss.value()

  return -jax.grad(loss)(z_V)


def expected_update(cfg, z_V, behav_logits_V, adv: float):
  return np.asarray(_expected_update(cfg, z_V, behav_logits_V, jnp.float32(adv)))


def test_drift_example_and_sc_removes_it():
  # pi = (0.5, 0.5), mu = (0.6, 0.4), A = 1: E_mu[e_y - pi] = mu - pi = (+0.1, -0.1).
  z = jnp.zeros(2)
  behav = jnp.log(jnp.array([0.6, 0.4]))
  drift = expected_update(get_preset("reinforce", aggregation="seq_mean_token_sum"), z, behav, 1.0)
  np.testing.assert_allclose(drift, [0.1, -0.1], atol=1e-6)
  centred = expected_update(get_preset("score_centering"), z, behav, 1.0)
  np.testing.assert_allclose(centred, [0.0, 0.0], atol=1e-6)  # rounding, as below; measured 7.5e-9


# pi and mu over V = 5 with rho(v) = pi/mu spanning (0.2, 4): TIS at C = 2 binds on some v.
PI_LOGITS = jnp.log(jnp.array([0.40, 0.25, 0.20, 0.10, 0.05]))
MU_LOGITS = jnp.log(jnp.array([0.10, 0.30, 0.25, 0.10, 0.25]))


@pytest.mark.parametrize("name", ["score_centering", "tis_sc", "mis_sc"])
def test_centred_update_has_zero_mean_under_mu(name):
  for adv in (1.7, -0.6):  # any advantage
    got = expected_update(get_preset(name), PI_LOGITS, MU_LOGITS, adv)
    # zero by cancellation of f32 sums over the V = 5 rows of terms |A| w mu |e_y - pi| (and the
    # centring's), sum|terms| ~ 2 |A| ~ 3.4: bounded by ~5 * u * 3.4 ~ 1e-6, 1e4 below the drift of
    # the next test (> 1e-2); measured <= 7.1e-8 (deterministic inputs)
    np.testing.assert_allclose(got, np.zeros(5), atol=1e-6)


def test_clipping_reintroduces_drift_and_is_cancels_it():
  # docs/objectives.md section 8: E_mu[rho s] = 0 (raw IS), but E_mu[min(rho, C) s] != 0.
  raw_is = get_preset("tis_sc", correction="is", kappa=0)
  # rounding as in the test above; measured 3.0e-8
  np.testing.assert_allclose(expected_update(raw_is, PI_LOGITS, MU_LOGITS, 1.0), np.zeros(5), atol=1e-6)
  tis = get_preset("tis_sc", kappa=0)
  assert np.abs(expected_update(tis, PI_LOGITS, MU_LOGITS, 1.0)).max() > 1e-2


def _random_dists(seed, shape):
  k1, k2 = jax.random.split(jax.random.key(seed))
  z = 1.5 * jax.random.normal(k1, shape)
  zb = z + 0.8 * jax.random.normal(k2, shape)
  return z, jax.nn.log_softmax(zb)


@pytest.mark.parametrize("name", ["score_centering", "tis_sc"])
def test_topk_with_k_equal_v_is_exact(name):
  cfg = get_preset(name)
  z, behav_full = _random_dists(1, (2, 3, 6))
  ids = jnp.argsort(-behav_full, axis=-1)  # all V ids, mu-descending

  def exact(zz):
    return jnp.sum(centering_exact(jax.nn.log_softmax(zz), behav_full, cfg))

  def topk(zz):
    lp = jax.nn.log_softmax(zz)
    return jnp.sum(centering_topk(gather_topk(lp, ids), gather_topk(behav_full, ids), cfg))

  np.testing.assert_allclose(jax.jit(topk)(z), jax.jit(exact)(z), rtol=1e-5)
  np.testing.assert_allclose(jax.jit(jax.grad(topk))(z), jax.jit(jax.grad(exact))(z), rtol=1e-4, atol=1e-6)


def test_topk_gradient_matches_spec_gamma_formula():
  # docs/objectives.md eq. 8.5: grad = sum_{v in top-k} (mu_v - gamma pi_v) s_v, s_v = e_v - pi in logit space,
  # gamma = (1 - sum_topk mu) / (1 - sum_topk pi).
  cfg = get_preset("score_centering")
  z, behav_full = _random_dists(2, (1, 1, 8))
  k = 3
  ids = jnp.argsort(-behav_full, axis=-1)[..., :k]
  g = jax.jit(jax.grad(lambda zz: jnp.sum(centering_topk(gather_topk(jax.nn.log_softmax(zz), ids),
                                                 gather_topk(behav_full, ids), cfg))))(z)
  pi = np.asarray(jax.nn.softmax(z), np.float64)[0, 0]
  mu = np.exp(np.asarray(behav_full, np.float64))[0, 0]
  top = np.asarray(ids)[0, 0]
  gamma = (1 - mu[top].sum()) / (1 - pi[top].sum())
  want = np.zeros(8)
  for v in top:
    want += (mu[v] - gamma * pi[v]) * (np.eye(8)[v] - pi)
  np.testing.assert_allclose(np.asarray(g)[0, 0], want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["score_centering", "tis_sc"])
def test_topk_exact_when_tail_follows_trainer(name):
  # If mu(v) = gamma pi(v) on the tail (the approximation's assumption), top-k == exact, also with TIS.
  cfg = get_preset(name)
  pi = np.array([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
  top = np.array([0, 1, 2])
  mu = np.zeros(6)
  mu[top] = [0.10, 0.35, 0.25]  # rho = 3, 1/7, 1: TIS binds on v = 0
  gamma = (1 - mu[top].sum()) / (1 - pi[top].sum())  # = 0.3 / 0.4
  tail = np.setdiff1d(np.arange(6), top)
  mu[tail] = gamma * pi[tail]
  z = jnp.log(jnp.asarray(pi, jnp.float32))[None, None]
  behav_full = jnp.log(jnp.asarray(mu, jnp.float32))[None, None]
  ids = jnp.asarray(top)[None, None]

  def exact(zz):
    return jnp.sum(centering_exact(jax.nn.log_softmax(zz), behav_full, cfg))

  def topk(zz):
    return jnp.sum(centering_topk(gather_topk(jax.nn.log_softmax(zz), ids), gather_topk(behav_full, ids), cfg))

  np.testing.assert_allclose(jax.jit(jax.grad(topk))(z), jax.jit(jax.grad(exact))(z), rtol=1e-4, atol=1e-6)
