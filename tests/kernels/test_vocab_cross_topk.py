"""vocab_cross_topk (q as top-k) vs a reference that builds q over all of V."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testing import (IMPLS, N, TILES, TOLERANCES, V, assert_close,
                            random_inputs, ragged_mask)

from jaxrl_llm.kernels import (vocab_cross_topk, vocab_cross_topk_reference,
                               vocab_topk_reference)

K = 6
WEIGHTS = (0.9, -1.1, 0.6)  # cotangents of (cross, kl_pq, kl_qp)


def _mu_topk(n=N, d=20, v=V, seed=31):
  """The sampler's record: top-k ids and full-vocabulary log-probs of mu."""
  hq, wq = random_inputs(seed, jnp.float32, n=n, d=d, v=v)
  return vocab_topk_reference(hq, wq, k=K, temperature=1.3)


def _value_and_grad(op, q, tail, mask_N, **kw):
  def loss(hidden_ND, w_DV):
    out = op(hidden_ND, w_DV, q.ids, q.logp, tail=tail, temperature=0.7,
             mask_N=mask_N, **kw)
    total = sum(c * jnp.sum(x) for c, x in
                zip(WEIGHTS, (out.cross, out.kl_pq, out.kl_qp)))
    return total, out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


CASES = [pytest.param(kw.values[0], tail, jnp.float32,
                      id=f"{kw.id}-{tail}-f32")
         for kw in IMPLS for tail in ("rescale", "renormalize")]
CASES.append(pytest.param(dict(impl="pallas", interpret=True), "rescale",
                          jnp.bfloat16, id="pallas_interpret-rescale-bf16"))


@functools.cache
def _reference(tail, dtype):
  """Computed once per (tail, dtype) and shared by both implementations."""
  hidden_ND, w_DV = random_inputs(30, dtype)
  return _value_and_grad(vocab_cross_topk_reference, _mu_topk(), tail,
                         ragged_mask())(hidden_ND, w_DV)


@pytest.mark.slow
@pytest.mark.parametrize("kw,tail,dtype", CASES)
def test_forward_and_grad_match_reference(kw, tail, dtype):
  hidden_ND, w_DV = random_inputs(30, dtype)
  q = _mu_topk()
  mask_N = ragged_mask()
  tol = TOLERANCES[dtype]
  (_, out), grads = _value_and_grad(vocab_cross_topk, q, tail, mask_N,
                                    tiles=TILES, **kw)(hidden_ND, w_DV)
  (_, ref), ref_grads = _reference(tail, dtype)
  for name in ("cross", "kl_pq", "kl_qp"):
    assert_close(getattr(out, name), getattr(ref, name), tol["fwd"], name)
  assert_close(grads[0], ref_grads[0], tol["grad"], "d hidden")
  assert_close(grads[1], ref_grads[1], tol["grad"], "d w")
  assert np.all(np.asarray(out.cross)[29:] == 0.0)


def test_topk_score_centering_gradient_is_the_spec_formula():
  """docs/objectives.md eq. 8.5 (top-k Score Centering): grad of cross in logit space is
  sum_k (mu_k - gamma pi_k) (e_k - pi), gamma = (1 - sum mu_k)/(1 - sum pi_k).
  """
  v = 40
  q = _mu_topk(n=3, d=12, v=v)
  z_NV = 1.5 * jax.random.normal(jax.random.key(32), (3, v))
  grad = jax.jit(jax.grad(lambda z: jnp.sum(vocab_cross_topk(
      z, jnp.eye(v), q.ids, q.logp, tail="rescale", impl="xla_chunked",
      tiles=TILES.__class__(chunk_v=16)).cross)))(z_NV)
  pi = np.asarray(jax.nn.softmax(z_NV), np.float64)
  mu_k = np.exp(np.asarray(q.logp, np.float64))
  ids = np.asarray(q.ids)
  expected = np.zeros((3, v))
  for n in range(3):
    pi_k = pi[n, ids[n]]
    gamma = (1 - mu_k[n].sum()) / (1 - pi_k.sum())
    for k in range(K):
      e_k = np.eye(v)[ids[n, k]]
      expected[n] += (mu_k[n, k] - gamma * pi_k[k]) * (e_k - pi[n])
  assert_close(grad, expected, 1e-5, "d cross / d z")


def test_bad_inputs_raise():
  hidden_ND, w_DV = random_inputs(33, jnp.float32, n=N)
  q = _mu_topk()
  with pytest.raises(ValueError, match="tail='bucket'"):
    vocab_cross_topk(hidden_ND, w_DV, q.ids, q.logp, tail="bucket")
  with pytest.raises(ValueError, match="q_logp_NK has shape"):
    vocab_cross_topk(hidden_ND, w_DV, q.ids, q.logp[:, :3], tail="rescale")
  with pytest.raises(ValueError, match=r"q_ids_NK\[0, 0\]=301 is out of range"):
    vocab_cross_topk(hidden_ND, w_DV, q.ids.at[0, 0].set(V), q.logp,
                     tail="rescale")
