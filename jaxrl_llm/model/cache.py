"""The KV cache: a pytree of per-layer keys/values over S slots.

Contract (docs/architecture.md): a forward with a cache writes its T tokens
into slots [index, index + T), marks them valid where mask_BT is true, and
each query attends to valid slots <= its own slot. RoPE uses positions_BT,
independent of slots, so left-padded prompts work: padding occupies slots
but is never valid.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_llm.model.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  k_LBSKH: jax.Array  # keys after RoPE (and QK-norm), compute dtype
  v_LBSKH: jax.Array  # values
  mask_BS: jax.Array  # bool: slot holds a real token
  index: jax.Array  # int32 scalar: next slot to write, shared by all rows

  @property
  def length(self) -> int:
    """S, the number of slots."""
    return self.k_LBSKH.shape[2]


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> KVCache:
  """An empty cache of `length` slots; dtype defaults to cfg.compute_dtype."""
  for name, value in (("batch", batch), ("length", length)):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
  dtype = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
  shape = (cfg.n_layers, batch, length, cfg.n_kv_heads, cfg.head_dim)
  return KVCache(
      k_LBSKH=jnp.zeros(shape, dtype),
      v_LBSKH=jnp.zeros(shape, dtype),
      mask_BS=jnp.zeros((batch, length), jnp.bool_),
      index=jnp.zeros((), jnp.int32),
  )
