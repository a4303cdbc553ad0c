"""The sharded forward + backward both the two-process workers and the
single-process reference run (same config, key and batch)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm.model import ModelConfig, forward, logits
from jaxrl_llm.model.sharding import batch_sharding, init_sharded_params, param_shardings

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=48, qk_norm=True, init_std=0.2)
B, T = 8, 6


def global_batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, CFG.vocab_size, (B, T)).astype(np.int32)
  mask = np.ones((B, T), bool)
  mask[3, :2] = False
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
  return tokens, mask, positions


def run(mesh) -> dict:
  """Loss, and per-parameter gradient sums of squares, as Python floats."""
  params = init_sharded_params(CFG, jax.random.key(0), mesh)
  data = batch_sharding(mesh)
  # Every process builds only the shards of its own devices.
  batch = [jax.make_array_from_callback(x.shape, data, lambda idx, x=x: x[idx])
           for x in global_batch()]

  def step(params, tokens, mask, positions):
    def loss(params):
      hidden, _ = forward(params, CFG, tokens, positions, mask)
      logp = jax.nn.log_softmax(logits(params, CFG, hidden), axis=-1)
      return -jnp.sum(jnp.where(mask, logp[..., 1], 0.0)) / jnp.sum(mask)
    value, grad = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda g: jnp.sum(jnp.square(g)), grad)

  replicated = NamedSharding(mesh, P())
  shardings = param_shardings(CFG, mesh)
  value, sq = jax.jit(step, in_shardings=(shardings, data, data, data),
                      out_shardings=replicated)(params, *batch)
  local = lambda x: float(np.asarray(x.addressable_shards[0].data))  # replicated scalars
  flat = jax.tree_util.tree_flatten_with_path(sq)[0]
  return {"loss": local(value),
          "grad_sq": {jax.tree_util.keystr(p): local(v) for p, v in flat}}
