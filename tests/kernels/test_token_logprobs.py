"""token_logprobs / gather_logprobs vs the plain-jnp reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_testing import (IMPLS, N, TILES, TOLERANCES, V, assert_close,
                            random_inputs, ragged_mask)

from jaxrl_llm.kernels import (VocabTiles, gather_logprobs, resolve_impl,
                               token_logprobs, token_logprobs_reference)

# Cotangent weights on (logp, entropy, lse): gradients must flow through all.
WEIGHTS = (1.3, -0.7, 0.4)


def _value_and_grad(op, targets_N, mask_N, temperature, **kw):
  def loss(hidden_ND, w_DV):
    out = op(hidden_ND, w_DV, targets_N, temperature=temperature,
             mask_N=mask_N, **kw)
    total = sum(c * jnp.sum(x) for c, x in
                zip(WEIGHTS, (out.logp, out.entropy, out.lse)))
    return total, out

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _case(dtype):
  hidden_ND, w_DV = random_inputs(0, dtype)
  targets_N = jax.random.randint(jax.random.key(1), (N,), 0, V)
  return hidden_ND, w_DV, targets_N, ragged_mask()


@functools.cache
def _reference(dtype):
  """Computed once per dtype and shared by both implementations' tests."""
  hidden_ND, w_DV, targets_N, mask_N = _case(dtype)
  return _value_and_grad(token_logprobs_reference, targets_N, mask_N,
                         0.7)(hidden_ND, w_DV)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16],
                         ids=["f32", "bf16"])
@pytest.mark.slow
@pytest.mark.parametrize("kw", IMPLS)
def test_forward_and_grad_match_reference(kw, dtype):
  hidden_ND, w_DV, targets_N, mask_N = _case(dtype)
  tol = TOLERANCES[dtype]
  (_, out), grads = _value_and_grad(token_logprobs, targets_N, mask_N, 0.7,
                                    tiles=TILES, **kw)(hidden_ND, w_DV)
  (_, ref), ref_grads = _reference(dtype)
  for name in ("logp", "entropy", "lse"):
    assert_close(getattr(out, name), getattr(ref, name), tol["fwd"], name)
  assert_close(grads[0], ref_grads[0], tol["grad"], "d hidden")
  assert_close(grads[1], ref_grads[1], tol["grad"], "d w")
  # Masked rows: zero outputs and zero d hidden.
  assert np.all(np.asarray(out.logp)[29:] == 0.0)
  assert np.all(np.asarray(grads[0], np.float32)[29:] == 0.0)
  assert grads[0].dtype == dtype and grads[1].dtype == dtype


def test_entropy_and_logp_by_hand():
  # Two tokens, D = V = 3, w = identity, temperature 2: logits = hidden / 2.
  hidden_ND = jnp.array([[2.0, 0.0, -2.0], [0.0, 0.0, 0.0]])
  w_DV = jnp.eye(3)
  out = token_logprobs(hidden_ND, w_DV, jnp.array([0, 2]), temperature=2.0,
                       impl="xla_chunked", tiles=VocabTiles(chunk_v=2))
  z = np.array([1.0, 0.0, -1.0])
  lse = np.log(np.sum(np.exp(z)))
  p = np.exp(z - lse)
  np.testing.assert_allclose(out.lse, [lse, np.log(3.0)], rtol=1e-6)
  # 1 - lse cancels 1.41 to -0.41: the error is ulps of lse (1.2e-7 each), absolute; measured 7.8e-8
  np.testing.assert_allclose(out.logp, [1.0 - lse, -np.log(3.0)], rtol=1e-6, atol=5e-7)
  np.testing.assert_allclose(out.entropy, [-np.sum(p * np.log(p)), np.log(3)],
                             rtol=1e-6)


def test_padding_rows_change_nothing():
  """Masked padding rows: same outputs and gradients as dropping them."""
  hidden_ND, w_DV = random_inputs(2, jnp.float32)
  targets_N = jax.random.randint(jax.random.key(3), (N,), 0, V)
  mask_N = ragged_mask()
  kw = dict(impl="xla_chunked", tiles=TILES)
  (_, out), grads = _value_and_grad(token_logprobs, targets_N, mask_N, 1.0,
                                    **kw)(hidden_ND, w_DV)
  (_, sub), sub_grads = _value_and_grad(token_logprobs, targets_N[:29], None,
                                        1.0, **kw)(hidden_ND[:29], w_DV)
  # Other row blocks, so other f32 sums: logp ~10 within ~2 ulps (measured <= 9e-8 relative);
  # d w sums 29 rows of h (p - y): ~29 u ~ 2e-6 of max|d w|, measured <= 3.8e-7 relative; 4 seeds
  assert_close(out.logp[:29], sub.logp, 1e-6, "logp")
  assert_close(grads[1], sub_grads[1], 1e-5, "d w")


def test_gather_logprobs_k_ids_match_reference():
  hidden_ND, w_DV = random_inputs(4, jnp.float32)
  ids_NK = jax.random.randint(jax.random.key(5), (N, 3), 0, V)
  out = gather_logprobs(hidden_ND, w_DV, ids_NK, temperature=1.5,
                        impl="xla_chunked", tiles=TILES)
  logp_NV = jax.nn.log_softmax(
      np.asarray(hidden_ND) @ np.asarray(w_DV) / 1.5, axis=-1)
  assert_close(out.logp, jnp.take_along_axis(logp_NV, ids_NK, axis=1), 2e-5,
               "logp")


def test_out_of_range_targets():
  hidden_ND, w_DV = random_inputs(6, jnp.float32, n=4, v=20)
  bad_N = jnp.array([0, 20, 3, -1])
  with pytest.raises(ValueError, match=r"targets_N\[1\]=20 is out of range"):
    token_logprobs(hidden_ND, w_DV, bad_N, impl="xla_chunked")
  # Masked rows are not checked.
  token_logprobs(hidden_ND, w_DV, bad_N, impl="xla_chunked",
                 mask_N=jnp.array([True, False, True, False]))
  # Under jit the values cannot be checked: those rows become NaN.
  out = jax.jit(lambda t: token_logprobs(hidden_ND, w_DV, t,
                                         impl="xla_chunked"))(bad_N)
  assert np.isnan(np.asarray(out.logp)).tolist() == [False, True, False, True]
  assert np.all(np.isfinite(np.asarray(out.entropy)))


def test_bad_inputs_raise_clear_errors():
  hidden_ND, w_DV = random_inputs(7, jnp.float32, n=4, v=20)
  t_N = jnp.zeros((4,), jnp.int32)
  with pytest.raises(ValueError, match=r"w_DV.shape\[0\]=20 must equal hidden_ND.shape\[1\]=24"):
    token_logprobs(hidden_ND, w_DV.T, t_N)
  with pytest.raises(ValueError, match="targets_N has shape"):
    token_logprobs(hidden_ND, w_DV, t_N[:3])
  with pytest.raises(TypeError, match="targets_N has dtype"):
    token_logprobs(hidden_ND, w_DV, t_N.astype(jnp.float32))
  with pytest.raises(ValueError, match="temperature=0.0"):
    token_logprobs(hidden_ND, w_DV, t_N, temperature=0.0)
  with pytest.raises(ValueError, match="impl='fast'"):
    token_logprobs(hidden_ND, w_DV, t_N, impl="fast")
  with pytest.raises(ValueError, match="mask_N has shape"):
    token_logprobs(hidden_ND, w_DV, t_N, mask_N=jnp.ones((5,), bool))
  with pytest.raises(ValueError, match="pass interpret=True"):
    token_logprobs(hidden_ND, w_DV, t_N, impl="pallas")
  with pytest.raises(ValueError, match="VocabTiles.block_v=48"):
    VocabTiles(block_v=48)
  with pytest.raises(ValueError, match="VocabTiles.chunk_v=0"):
    VocabTiles(chunk_v=0)


def test_auto_picks_chunked_xla_on_cpu():
  assert resolve_impl("auto", None) == ("xla_chunked", False)
  assert resolve_impl("pallas", True) == ("pallas_triton", True)


def test_sharded_rows_match_single_device():
  """Per-device use inside shard_map (rows over 8 devices, w replicated)."""
  from jax.sharding import PartitionSpec as P
  n = 40
  hidden_ND, w_DV = random_inputs(8, jnp.float32, n=n)
  targets_N = jax.random.randint(jax.random.key(9), (n,), 0, V)
  mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))

  def per_device(h, w, t):
    return token_logprobs(h, w, t, temperature=0.7, impl="xla_chunked",
                          tiles=TILES).logp

  sharded = jax.shard_map(per_device, mesh=mesh, in_specs=(P("x"), P(), P("x")),
                          out_specs=P("x"))
  loss = lambda f: jax.jit(jax.value_and_grad(
      lambda h, w: jnp.sum(f(h, w, targets_N) ** 2), argnums=(0, 1)))
  val, grads = loss(sharded)(hidden_ND, w_DV)
  ref_val, ref_grads = loss(per_device)(hidden_ND, w_DV)
  assert_close(val, ref_val, 1e-5, "loss")
  assert_close(grads[0], ref_grads[0], 1e-5, "d hidden")
  assert_close(grads[1], ref_grads[1], 1e-5, "d w")
