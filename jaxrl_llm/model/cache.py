"""The KV cache: a pytree of per-layer keys/values over S slots.

Contract (docs/architecture.md): a forward with a cache writes its T tokens
into slots [index, index + T), marks them valid where mask_BT is true, and
each query attends to valid slots <= its own slot. RoPE uses positions_BT,
independent of slots, so left-padded prompts work: padding occupies slots
but is never valid.

Layout: per layer (a tuple of L arrays, not one stacked [L, ...] array),
keys transposed as [B, K_kv, H, S] and values as [B, K_kv, S, H]. Each
layer's keys and values are then buffers of their own that attention reads
directly and that a decode step updates in place; from a stacked array every
layer would first slice (copy) its part out at every step. In these layouts
q k^T and p v are plain batched matmuls over (B, K), with no transpose of
the cache (see layers.attention).

A model with local (sliding-window) layers also keeps each slot's RoPE
position, `positions_BS`: a local layer's window is a range of positions
(the last W tokens of the row, wherever padding put them in the slots), so a
decode step needs the positions of the keys it may read. Other models keep
None there and pay nothing. Every layer keeps all S slots; a local layer
masks the slots outside its window (no ring buffer).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_llm.model.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  k_BKHS: tuple[jax.Array, ...]  # per layer: keys after RoPE (and QK-norm), compute dtype
  v_BKSH: tuple[jax.Array, ...]  # per layer: values
  mask_BS: jax.Array  # bool: slot holds a real token
  index: jax.Array  # int32 scalar: next slot to write, shared by all rows
  positions_BS: jax.Array | None = None  # int32 RoPE position of each slot (models with local layers)

  @property
  def length(self) -> int:
    """S, the number of slots."""
    return self.v_BKSH[0].shape[2]

  def map_rows(self, fn) -> "KVCache":
    """fn applied to every per-row array (keys, values, mask), all of which
    have the rows (B) on axis 0 (e.g. repeat or shard the rows)."""
    return self.replace(k_BKHS=tuple(fn(k) for k in self.k_BKHS),
                        v_BKSH=tuple(fn(v) for v in self.v_BKSH), mask_BS=fn(self.mask_BS),
                        positions_BS=None if self.positions_BS is None else fn(self.positions_BS))

  def resize(self, length: int) -> "KVCache":
    """The cache cut or zero-padded to `length` slots (new slots invalid)."""
    def fit(x, axis):
      if length <= x.shape[axis]:
        return jax.lax.slice_in_dim(x, 0, length, axis=axis)
      pad = [(0, 0)] * x.ndim
      pad[axis] = (0, length - x.shape[axis])
      return jnp.pad(x, pad)
    return self.replace(k_BKHS=tuple(fit(k, 3) for k in self.k_BKHS),
                        v_BKSH=tuple(fit(v, 2) for v in self.v_BKSH), mask_BS=fit(self.mask_BS, 1),
                        positions_BS=None if self.positions_BS is None else fit(self.positions_BS, 1))


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> KVCache:
  """An empty cache of `length` slots; dtype defaults to cfg.compute_dtype."""
  for name, value in (("batch", batch), ("length", length)):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
  dtype = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
  B, K, S, H = batch, cfg.n_kv_heads, length, cfg.head_dim
  return KVCache(
      k_BKHS=tuple(jnp.zeros((B, K, H, S), dtype) for _ in range(cfg.n_layers)),
      v_BKSH=tuple(jnp.zeros((B, K, S, H), dtype) for _ in range(cfg.n_layers)),
      mask_BS=jnp.zeros((batch, length), jnp.bool_),
      index=jnp.zeros((), jnp.int32),
      positions_BS=jnp.zeros((batch, length), jnp.int32) if cfg.has_local_layers else None,
  )
