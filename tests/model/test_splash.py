"""The splash attention path (model/splash.py) against the XLA attention written plainly.

The kernels run in Pallas's interpreter on CPU (`interpret=True`, the default off a TPU target),
on small shapes: T = 200 (padded to 256, one block), T = 384 (three blocks of 128, so the causal
and local masks skip and split blocks). Values and gradients of q, k, v and of a model's params.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.model import ModelConfig, forward
from jaxrl_llm.model import splash as splash_lib
from jaxrl_llm.model.packing import pack_rows
from jaxrl_llm.model.params import init_params
from jaxrl_llm.model.sharding import MeshConfig, make_mesh


def _qkv(B, T, N, K, H, seed, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(kq, (B, T, N, H), dtype), jax.random.normal(kk, (B, T, K, H), dtype),
          jax.random.normal(kv, (B, T, K, H), dtype))


def _ragged_mask(T, starts, ends):
  t_T = np.arange(T)
  return jnp.asarray((t_T[None, :] >= np.array(starts)[:, None]) & (t_T[None, :] < np.array(ends)[:, None]))


def _values_and_grads(fn, q, k, v, mask_BT, **kw):
  """fn's output and its vjp against a fixed random cotangent: the gradients wrt q, k, v (jitted:
  the interpreter runs as one program)."""
  @jax.jit
  def run(q, k, v, mask_BT):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask_BT, **kw), q, k, v)
    return out, vjp(jax.random.normal(jax.random.key(9), out.shape, out.dtype))
  return run(q, k, v, mask_BT)


def _assert_close(got, want, tol):
  out, grads = got
  ref_out, ref_grads = want
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref_out, np.float32), atol=tol, rtol=tol)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=tol, rtol=tol)


def test_causal_gqa_with_padding_matches_the_reference():
  # GQA (4 query heads over 2 KV heads), a left-padded row and a right-padded one; T = 200 pads to 256.
  q, k, v = _qkv(2, 200, 4, 2, 32, seed=0)
  mask_BT = _ragged_mask(200, [0, 17], [190, 200])
  got = _values_and_grads(splash_lib.splash_attention, q, k, v, mask_BT, softcap=30.0)
  want = _values_and_grads(splash_lib.splash_attention_reference, q, k, v, mask_BT, softcap=30.0)
  _assert_close(got, want, 2e-5)
  # Padding queries return zeros and pass no gradient.
  assert np.all(np.asarray(got[0])[1, :17] == 0.0) and np.all(np.asarray(got[1][0])[0, 190:] == 0.0)


def test_local_window_and_segments_match_the_reference():
  # MQA (2 query heads, 1 KV head), 3 blocks of 128, a window of 100 slots, two documents per row.
  q, k, v = _qkv(2, 384, 2, 1, 32, seed=1)
  mask_BT = _ragged_mask(384, [0, 5], [384, 370])
  segments_BT = jnp.asarray(np.where(np.arange(384)[None, :] < np.array([[150], [260]]), 1, 2), jnp.int32)
  kw = dict(segments_BT=segments_BT, window=100, scale=0.1)
  got = _values_and_grads(splash_lib.splash_attention, q, k, v, mask_BT, **kw)
  want = _values_and_grads(splash_lib.splash_attention_reference, q, k, v, mask_BT, **kw)
  _assert_close(got, want, 2e-5)


def test_bf16_matches_the_f32_reference_to_bf16_rounding():
  # bf16 inputs: the kernel rounds q * scale and the probabilities to bf16 before p v (as the XLA
  # path rounds the probabilities) and its output to bf16, each a relative 2^-8 = 0.0039; outputs
  # are O(1) averages of unit normals, so 2e-2 absolute covers a few such roundings.
  q, k, v = _qkv(1, 256, 2, 2, 32, seed=2, dtype=jnp.bfloat16)
  mask_BT = _ragged_mask(256, [3], [256])
  out = jax.jit(splash_lib.splash_attention)(q, k, v, mask_BT)
  ref = splash_lib.splash_attention_reference(*(x.astype(jnp.float32) for x in (q, k, v)), mask_BT)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=2e-2)


@pytest.mark.parametrize("mesh_shape", [(4, 1, 2), (2, 1, 4)])
def test_sharded_over_rows_and_heads_matches_the_reference(mesh_shape):
  # 8 CPU devices, the kernel per device in shard_map: rows over data (4), heads over tensor (2);
  # then rows over data (2) and the heads whole on each of 4 tensor devices (2 KV heads do not split
  # 4 ways), on a second mesh in the same process.
  q, k, v = _qkv(4, 128, 4, 2, 16, seed=3)
  mask_BT = _ragged_mask(128, [0, 9, 0, 40], [128, 128, 100, 128])
  with jax.set_mesh(make_mesh(MeshConfig(*mesh_shape))):
    got = _values_and_grads(splash_lib.splash_attention, q, k, v, mask_BT)
  want = _values_and_grads(splash_lib.splash_attention_reference, q, k, v, mask_BT)
  _assert_close(got, want, 2e-5)


def _gemma_like(attention_impl):
  # Local and global layers in one scan (a traced layer kind), GQA, a window shorter than the rows.
  return ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=64,
                     layer_types=("sliding_attention", "full_attention"), sliding_window=40,
                     rope_local_theta=10000.0, attention_impl=attention_impl)


def test_model_forward_and_gradients_with_splash_equal_xla():
  # Packed documents (segments, documents_only) with padding at both ends; compared at the real
  # tokens: a padding query's output is zeros under splash, while XLA's causal mask lets a
  # right-padding query read earlier real keys; both weigh zero in every loss.
  cfg_xla, cfg_splash = _gemma_like("xla"), _gemma_like("splash")
  params = init_params(cfg_xla, jax.random.key(4))
  B, T = 2, 100
  tokens_BT = jax.random.randint(jax.random.key(5), (B, T), 0, 64)
  mask_BT = _ragged_mask(T, [0, 11], [90, 100])
  positions_BT = jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=1) - 1, 0)
  segments_BT = jnp.asarray(np.where(np.arange(T)[None, :] < np.array([[55], [60]]), 1, 2), jnp.int32)

  @functools.partial(jax.jit, static_argnums=1)
  def run(params, cfg_is_splash):
    cfg = cfg_splash if cfg_is_splash else cfg_xla
    def loss(params):
      hidden_BTD, _ = forward(params, cfg, tokens_BT, positions_BT, mask_BT, segments_BT=segments_BT,
                              documents_only=True)
      hidden_BTD = jnp.where(mask_BT[:, :, None], hidden_BTD, 0.0)
      return jnp.sum(jnp.sin(hidden_BTD)), hidden_BTD
    return jax.value_and_grad(loss, has_aux=True)(params)

  (_, h_xla), g_xla = run(params, False)
  (_, h_splash), g_splash = run(params, True)
  np.testing.assert_allclose(np.asarray(h_splash), np.asarray(h_xla), atol=3e-5, rtol=3e-5)
  for a, b in zip(jax.tree.leaves(g_splash), jax.tree.leaves(g_xla)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_auto_is_xla_on_cpu_and_a_bad_value_names_the_field():
  assert splash_lib.resolve_attention("auto", 1024) == "xla"
  assert splash_lib.resolve_attention("splash", 16) == "splash"
  with pytest.raises(ConfigError, match=r"ModelConfig.attention_impl='flash' is invalid: allowed \('auto', 'xla', 'splash'\)"):
    _gemma_like("flash")


def test_block_size_rule():
  # T rounded up to 128, then the largest of 512, 256, 128 dividing it.
  assert splash_lib.block_size(200) == (256, 256)
  assert splash_lib.block_size(384) == (128, 384)
  assert splash_lib.block_size(1000) == (512, 1024)
  assert splash_lib.block_size(1100) == (128, 1152)


def test_packing_records_its_group_for_the_splash_route():
  # A packing of single rows (group 1) runs documents only: model.forward may take the splash path;
  # one of groups sharing a prompt (parts > 0) keeps the XLA attention.
  prompt_mask_BP, attend_BR = np.ones((2, 4), bool), np.ones((2, 3), bool)
  assert pack_rows(prompt_mask_BP, attend_BR, group=1, length=16, buffers=1).group == 1
  assert pack_rows(prompt_mask_BP, attend_BR, group=2, length=16, buffers=1).group == 2
