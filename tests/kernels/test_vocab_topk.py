"""vocab_topk vs the plain-jnp reference (lax.top_k over full logits)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testing import (IMPLS, N, TILES, TOLERANCES, V, assert_close,
                            random_inputs, ragged_mask)

from jaxrl_llm.kernels import vocab_topk, vocab_topk_reference

K = 5  # padded to 8 inside the Pallas kernel


def _value_and_grad(op, cot_NK, mask_N, **kw):
  def loss(hidden_ND, w_DV):
    out = op(hidden_ND, w_DV, k=K, temperature=0.7, mask_N=mask_N, **kw)
    return jnp.sum(out.logp * cot_NK), out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _case(dtype):
  hidden_ND, w_DV = random_inputs(10, dtype)
  cot_NK = jax.random.normal(jax.random.key(11), (N, K))
  return hidden_ND, w_DV, cot_NK, ragged_mask()


@functools.cache
def _reference(dtype):
  hidden_ND, w_DV, cot_NK, mask_N = _case(dtype)
  return _value_and_grad(vocab_topk_reference, cot_NK, mask_N)(hidden_ND, w_DV)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.parametrize("kw", IMPLS)
def test_forward_and_grad_match_reference(kw, dtype):
  hidden_ND, w_DV, cot_NK, mask_N = _case(dtype)
  tol = TOLERANCES[dtype]
  (_, out), grads = _value_and_grad(vocab_topk, cot_NK, mask_N, tiles=TILES,
                                    **kw)(hidden_ND, w_DV)
  (_, ref), ref_grads = _reference(dtype)
  np.testing.assert_array_equal(out.ids, ref.ids)
  assert out.ids.dtype == jnp.int32
  assert_close(out.logp, ref.logp, tol["fwd"], "logp")
  assert_close(grads[0], ref_grads[0], tol["grad"], "d hidden")
  assert_close(grads[1], ref_grads[1], tol["grad"], "d w")
  assert np.all(np.asarray(out.logp)[29:] == 0.0)


def test_k_equal_v_is_the_sorted_log_softmax():
  hidden_ND, w_DV = random_inputs(12, jnp.float32, n=3, v=40)
  out = jax.jit(lambda h, w: vocab_topk(h, w, k=40, impl="xla_chunked",
                                        tiles=TILES.__class__(chunk_v=16)))(
                                            hidden_ND, w_DV)
  logp_NV = np.asarray(jax.nn.log_softmax(hidden_ND @ w_DV, axis=-1))
  order = np.argsort(-logp_NV, axis=-1, kind="stable")
  np.testing.assert_array_equal(out.ids, order)
  assert_close(out.logp, np.take_along_axis(logp_NV, order, axis=-1), 1e-5,
               "logp")
  # Normalised over the full vocabulary: with k = V the probs sum to 1.
  np.testing.assert_allclose(np.exp(out.logp).sum(-1), 1.0, rtol=1e-5)


def test_bad_k_raises():
  hidden_ND, w_DV = random_inputs(13, jnp.float32, n=2, v=V)
  with pytest.raises(ValueError, match=f"k={V + 1}: must satisfy 1 <= k <= V"):
    vocab_topk(hidden_ND, w_DV, k=V + 1)
  with pytest.raises(ValueError, match="k=0"):
    vocab_topk(hidden_ND, w_DV, k=0)
  with pytest.raises(TypeError, match="k=2.0"):
    vocab_topk(hidden_ND, w_DV, k=2.0)
