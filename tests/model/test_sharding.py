"""Sharded forward and gradient == single-device ones on the fake 8-device CPU
mesh; the sharding table splits every large param; mesh/config errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm.model import ModelConfig, forward, init_params, logits
from jaxrl_llm.model.sharding import (MeshConfig, batch_sharding, init_sharded_params,
                                      make_mesh, param_shardings, shard_params,
                                      unsharded_params)

# Every sharded dim divides by 8 (D) or 2 (heads, kv-heads, F, V over tensor).
CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, qkv_bias=True, init_std=0.2)
B, T = 8, 6
# f32 on CPU: sharded matmuls reduce in a different order (partial sums over
# fsdp/tensor shards), so agreement is to float rounding, not bit-exact.
# The loss: a mean of B*T = 48 terms -log p ~ 5, bounded by 48 u ~ 3e-6 relative; measured <= 1.9e-7.
# Hidden states ~3.6 after two layers of sums over D = 32 and F = 48: ~2 (D + F) u |h| ~ 3e-5;
# measured <= 2.5e-6. Gradients (|g| <= 0.8) also sum over the 48 tokens: measured <= 4.5e-7.
# All over 5 seeds.
RTOL_VALUE, ATOL_HIDDEN, RTOL_GRAD, ATOL_GRAD = 5e-6, 3e-5, 1e-4, 5e-6


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (B, T), 0, CFG.vocab_size)
  mask = jnp.ones((B, T), bool).at[1, :2].set(False).at[5, :4].set(False)
  positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0).astype(jnp.int32)
  return tokens, mask, positions


def _loss_and_grad(params, tokens, mask, positions):
  def loss(params):
    hidden, _ = forward(params, CFG, tokens, positions, mask)
    logp = jax.nn.log_softmax(logits(params, CFG, hidden), axis=-1)
    return -jnp.mean(logp[..., 0]), hidden
  (value, hidden), grad = jax.value_and_grad(loss, has_aux=True)(params)
  return value, hidden, grad


@functools.lru_cache(maxsize=None)
def _reference():
  params = jax.jit(functools.partial(init_params, CFG))(jax.random.key(0))
  return params, jax.jit(_loss_and_grad)(params, *_batch())


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2)])
def test_sharded_forward_and_grad_match_single_device(shape):
  params, (ref_value, ref_hidden, ref_grad) = _reference()
  mesh = make_mesh(MeshConfig(*shape))
  shardings = param_shardings(CFG, mesh)
  sharded = shard_params(params, CFG, mesh)
  data = batch_sharding(mesh)
  step = jax.jit(_loss_and_grad, in_shardings=(shardings, data, data, data),
                 out_shardings=(NamedSharding(mesh, P()), batch_sharding(mesh, 3), shardings))
  tokens, mask, positions = (jax.device_put(x, data) for x in _batch())
  value, hidden, grad = step(sharded, tokens, mask, positions)
  assert hidden.sharding.spec == P(("data", "fsdp"), None, None)
  np.testing.assert_allclose(value, ref_value, rtol=RTOL_VALUE)
  np.testing.assert_allclose(np.asarray(hidden), np.asarray(ref_hidden), atol=ATOL_HIDDEN)
  jax.tree.map(lambda g, r: np.testing.assert_allclose(np.asarray(g), np.asarray(r),
                                                       rtol=RTOL_GRAD, atol=ATOL_GRAD),
               grad, ref_grad)
  # Gradients come back in the params' own shardings (ready for the update).
  assert grad["layers"]["wq_LDNH"].sharding == shardings["layers"]["wq_LDNH"]


@pytest.mark.slow
def test_sharded_init_matches_single_device_init():
  params, _ = _reference()
  mesh = make_mesh(MeshConfig(2, 2, 2))
  sharded = init_sharded_params(CFG, jax.random.key(0), mesh)
  assert sharded["embed_VD"].sharding.spec == P("tensor", "fsdp")
  # Same random numbers up to the last bit of the fused normal transform
  # (0.2 * N(0, 1) is O(1), so 1e-7 is a few ulps).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-7), sharded, params)


@pytest.mark.parametrize("shape", [(1, 8, 1), (2, 2, 2), (1, 4, 2)])
def test_no_large_param_replicated_when_fsdp_above_one(shape):
  mesh = make_mesh(MeshConfig(*shape))
  # "Large": anything but the norm scales and biases (<= L * D elements).
  large = CFG.n_layers * CFG.d_model + 1
  assert unsharded_params(CFG, mesh, min_size=large) == []
  params = shard_params(_reference()[0], CFG, mesh)
  fsdp = dict(mesh.shape)["fsdp"]
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if leaf.size >= large:
      shard = leaf.addressable_shards[0].data
      assert shard.size * fsdp <= leaf.size, f"{jax.tree_util.keystr(path)} not split by fsdp"


def test_data_parallel_mesh_replicates_params():
  mesh = make_mesh(MeshConfig(8, 1, 1))
  assert len(unsharded_params(CFG, mesh)) == len(jax.tree.leaves(_reference()[0]))


def test_mesh_size_must_match_devices():
  with pytest.raises(ValueError, match=r"2\*2\*1 = 4 must equal the number of devices \(8\)"):
    make_mesh(MeshConfig(2, 2, 1))
  with pytest.raises(ValueError, match="MeshConfig.tensor"):
    MeshConfig(1, 1, 0)


def test_heads_must_divide_by_tensor_axis():
  mesh = make_mesh(MeshConfig(1, 2, 4))
  with pytest.raises(ValueError, match=r"n_kv_heads=2 is not divisible by the 'tensor' mesh axis of size 4"):
    param_shardings(CFG, mesh)
  bad = CFG.replace(n_heads=6, n_kv_heads=6)
  with pytest.raises(ValueError, match=r"n_heads=6 is not divisible"):
    init_sharded_params(bad, jax.random.key(0), mesh)
