"""vocab_cross (q from hidden_q, w_q) vs the plain-jnp reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testing import (IMPLS, N, TILES, TOLERANCES, V, assert_close,
                            random_inputs, ragged_mask)

from jaxrl_llm.kernels import vocab_cross, vocab_cross_reference

E = 20  # q's model dim differs from p's (a teacher of another width)
WEIGHTS = (0.9, -1.1, 0.6)  # cotangents of (cross, kl_pq, kl_qp)


def _q_inputs(dtype):
  hidden_q_NE, w_q_EV = random_inputs(21, dtype, d=E)
  return hidden_q_NE, w_q_EV


def _value_and_grad(op, hidden_q_NE, w_q_EV, mask_N, **kw):
  def loss(hidden_ND, w_DV, hq, wq):
    out = op(hidden_ND, w_DV, hq, wq, temperature=0.7, temperature_q=1.3,
             mask_N=mask_N, **kw)
    total = sum(c * jnp.sum(x) for c, x in
                zip(WEIGHTS, (out.cross, out.kl_pq, out.kl_qp)))
    return total, out

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
  return jax.jit(lambda h, w: grad(h, w, hidden_q_NE, w_q_EV))


@functools.cache
def _reference(dtype):
  """Computed once per dtype and shared by both implementations' tests."""
  hidden_ND, w_DV = random_inputs(20, dtype)
  hidden_q_NE, w_q_EV = _q_inputs(dtype)
  return _value_and_grad(vocab_cross_reference, hidden_q_NE, w_q_EV,
                         ragged_mask())(hidden_ND, w_DV)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.parametrize("kw", IMPLS)
def test_forward_and_grad_match_reference(kw, dtype):
  hidden_ND, w_DV = random_inputs(20, dtype)
  hidden_q_NE, w_q_EV = _q_inputs(dtype)
  mask_N = ragged_mask()
  tol = TOLERANCES[dtype]
  (_, out), grads = _value_and_grad(vocab_cross, hidden_q_NE, w_q_EV, mask_N,
                                    tiles=TILES, **kw)(hidden_ND, w_DV)
  (_, ref), ref_grads = _reference(dtype)
  for name in ("cross", "kl_pq", "kl_qp"):
    assert_close(getattr(out, name), getattr(ref, name), tol["fwd"], name)
  assert_close(grads[0], ref_grads[0], tol["grad"], "d hidden")
  assert_close(grads[1], ref_grads[1], tol["grad"], "d w")
  # q is stop-gradient.
  assert not np.any(np.asarray(grads[2], np.float32))
  assert not np.any(np.asarray(grads[3], np.float32))
  assert np.all(np.asarray(out.kl_pq)[29:] == 0.0)
  # KL >= 0 on real tokens.
  assert np.all(np.asarray(out.kl_pq)[:29] > 0.0)
  assert np.all(np.asarray(out.kl_qp)[:29] > 0.0)


def test_exact_score_centering_gradient_in_logit_space():
  """d cross / d z = mu - p (docs/objectives.md eq. 8.1: the drift s_bar in logit space).

  With w = identity and temperature 1 the hidden states are the logits.
  """
  z_NV = 2.0 * jax.random.normal(jax.random.key(22), (4, 50))
  y_NV = 2.0 * jax.random.normal(jax.random.key(23), (4, 50))
  eye = jnp.eye(50)
  grad = jax.jit(jax.grad(lambda z: jnp.sum(vocab_cross(
      z, eye, y_NV, eye, impl="xla_chunked",
      tiles=TILES.__class__(chunk_v=16)).cross)))(z_NV)
  mu, p = np.asarray(jax.nn.softmax(y_NV)), np.asarray(jax.nn.softmax(z_NV))
  assert_close(grad, mu - p, 1e-5, "d cross / d z")


def test_identical_distributions_give_zero_kl():
  hidden_ND, w_DV = random_inputs(24, jnp.float32, n=5)
  out = jax.jit(lambda h, w: vocab_cross(
      h, w, h, w, temperature=0.8, temperature_q=0.8, impl="xla_chunked",
      tiles=TILES))(hidden_ND, w_DV)
  assert_close(out.kl_pq, np.zeros(5), 1e-5, "kl_pq")
  assert_close(out.kl_qp, np.zeros(5), 1e-5, "kl_qp")


def test_mismatched_q_shapes_raise():
  hidden_ND, w_DV = random_inputs(25, jnp.float32, n=4)
  hq, wq = random_inputs(26, jnp.float32, n=4, d=E, v=V - 1)
  with pytest.raises(ValueError, match=f"V={V - 1} but p side has N=4, V={V}"):
    vocab_cross(hidden_ND, w_DV, hq, wq)
  with pytest.raises(ValueError, match=r"w_q_EV.shape\[0\]=20 must equal"):
    vocab_cross(hidden_ND, w_DV, hidden_ND, wq)
  with pytest.raises(ValueError, match="temperature_q=-1.0"):
    vocab_cross(hidden_ND, w_DV, hidden_ND, w_DV, temperature_q=-1.0)
