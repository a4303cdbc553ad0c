"""Which cache slots each query of a forward call may attend to: causal over valid slots, a
sliding-window layer's window in positions, and segments (documents and their parts) for packed
or prompt-sharing layouts (model/packing.py, model/logprobs.shared_prompt_rows)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_llm.model.cache import KVCache
from jaxrl_llm.model.config import ModelConfig

PART_BITS = 12  # a segment id is document << PART_BITS | part (model/packing.py)


def segment_id(document: int, part: int) -> int:
  """The segment id of `part` of `document` (forward's segments_BT): a query sees the earlier slots of
  its own document in its own part or in part 0 (the document's prefix, e.g. a prompt its parts
  share). Document 0 with parts 0, 1, .. is one group's [prompt | responses] (logprobs.shared_prompt_rows);
  packed rows (model/packing.py) are documents 1, 2, .. of their buffer."""
  if not 0 <= part < 1 << PART_BITS:
    raise ValueError(f"segment_id: part {part} is outside [0, {1 << PART_BITS})")
  return (document << PART_BITS) | part


@dataclasses.dataclass(frozen=True)
class Visibility:
  """Which cache slots each query may attend to, for one forward call."""

  index: jax.Array  # int32 []: the first slot the call writes (0 without a cache)
  kv_mask_BS: jax.Array  # bool [B, S]: slots holding a real token after the call's write
  kv_positions_BS: jax.Array | None  # int32 [B, S]: each slot's position (models with local layers), else None
  allowed_global_BTS: jax.Array  # bool [B, T, S]: a full-attention layer's mask (causal over valid slots)
  allowed_local_BTS: jax.Array  # bool [B, T, S]: a sliding-window layer's mask (= global without local layers)


def visibility(cfg: ModelConfig, positions_BT, mask_BT, cache: KVCache | None,
                segments_BT: jax.Array | None = None) -> Visibility:
  """The attention masks of one call: causal over valid slots, and a local layer's window in
  positions (q - W < k <= q: the last W tokens of the row, however padding spreads them over the slots).
  With segments_BT (no cache, `segment_id(document, part)`), a query sees the earlier slots of its
  own document whose part is its own or 0 (the document's shared prefix)."""
  B, T = mask_BT.shape
  slots_T = jnp.arange(T, dtype=jnp.int32)
  kv_positions_BS = None
  if cache is None:
    index = jnp.zeros((), jnp.int32)
    kv_mask_BS = mask_BT
    slots_S = slots_T
    if cfg.has_local_layers:
      kv_positions_BS = positions_BT
  else:
    S = cache.length
    if len(cache.k_BKHS) != cfg.n_layers or cache.k_BKHS[0].shape[0] != B:
      raise ValueError(
          f"forward: cache has {len(cache.k_BKHS)} layers of batch {cache.k_BKHS[0].shape[0]}, "
          f"expected (n_layers, batch) = {(cfg.n_layers, B)}")
    if T > S:
      raise ValueError(f"forward: {T} tokens do not fit in a cache of {S} slots")
    index = cache.index
    kv_mask_BS = jax.lax.dynamic_update_slice(cache.mask_BS, mask_BT, (0, index))
    slots_S = jnp.arange(S, dtype=jnp.int32)
    if cfg.has_local_layers:
      if cache.positions_BS is None:
        raise ValueError("forward: this model has sliding-window layers and needs a cache with "
                         "positions_BS (make it with init_cache(cfg, ...))")
      kv_positions_BS = jax.lax.dynamic_update_slice(
          cache.positions_BS, positions_BT.astype(jnp.int32), (0, index))
  q_slots_T = index + slots_T
  allowed_global_BTS = (kv_mask_BS[:, None, :]
                        & (slots_S[None, None, :] <= q_slots_T[None, :, None]))
  if segments_BT is not None:
    if cache is not None:
      raise ValueError("forward: segments_BT is for a forward without a cache")
    if segments_BT.shape != mask_BT.shape:
      raise ValueError(f"forward: segments_BT {segments_BT.shape} must have the tokens' shape {mask_BT.shape}")
    seg_q_BT1, seg_k_B1S = segments_BT[:, :, None], segments_BT[:, None, :]
    part_k_B1S = seg_k_B1S & ((1 << PART_BITS) - 1)
    same_doc_BTS = (seg_k_B1S >> PART_BITS) == (seg_q_BT1 >> PART_BITS)
    allowed_global_BTS = allowed_global_BTS & same_doc_BTS & ((part_k_B1S == 0) | (seg_k_B1S == seg_q_BT1))
  allowed_local_BTS = allowed_global_BTS
  if cfg.has_local_layers:
    in_window_BTS = (positions_BT[:, :, None] - kv_positions_BS[:, None, :]) < cfg.sliding_window
    allowed_local_BTS = allowed_global_BTS & in_window_BTS
  return Visibility(index=index, kv_mask_BS=kv_mask_BS, kv_positions_BS=kv_positions_BS,
                     allowed_global_BTS=allowed_global_BTS, allowed_local_BTS=allowed_local_BTS)
