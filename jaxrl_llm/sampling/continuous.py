"""Continuous batching: a fixed number of slots, each taking the next queued sample when its own ends.

The static sampler (sampling/generate.py) decodes a batch until its longest row ends; with
long-tailed response lengths most rows then idle for most of the loop. Here the B0 x n_samples
samples of a call queue for `slots` rows of one decode state, and the loop runs in chunks:

    admit:  the slots whose sample ended (or that never had one) take the next queued samples: their
            prompts are encoded as one block (jitted `admit`, prefill interleaved with decode), and
            in the same forward every running slot feeds its last token, so every slot samples its
            next token;
    decode: `chunk` decode steps (jitted `decode_chunk`); a row that ends idles until the chunk's
            end: end of sequence is looked at on the host once per chunk, not per step;
    read:   the ended samples' records are copied out, and when the cache has no room left for a
            block and a chunk, its valid slots are moved to the front of each row (`compact`).

Shapes are static: the slots, the cache's S = 2 P + R + chunk slots (P the padded prompt width), the
record's R columns. The KV cache's slots need not be contiguous per row (attention reads the valid
ones, RoPE takes each token's own position), so a slot that takes a new sample only marks its old
slots invalid.

Randomness is keyed per sample and position as in the static sampler: sample b (prompt b // n,
its b % n-th draw) samples token t with fold_in(fold_in(key, b), t), whatever slot or chunk it runs
in, so the two samplers give the same tokens for the same key (up to the float rounding of another
attention layout: tests/sampling/test_continuous.py). log mu, the raw log-probs and the top-k are
recorded as the static sampler records them.

Not done: a group's samples do not share their prompt's keys and values (each slot encodes its
sample's prompt; the static sampler encodes it once per group).
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm import faults
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model import KVCache, forward, init_cache, logits, unstack_layers
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.generate import check_prompt_tokens, resolve_data_axis, sampler_model_config
from jaxrl_llm.sampling.loop import DecodeState, cast_params, decode_step, record_sample, shard_rows
from jaxrl_llm.sampling.rollout import FINISH_LENGTH, Rollout


def idle_state(model_cfg: ModelConfig, cfg: SamplingConfig, slots: int, cache_len: int) -> DecodeState:
  """A decode state of `slots` rows, none running, over an empty cache."""
  R, K = cfg.max_new_tokens, cfg.record_topk
  zeros = functools.partial(jnp.zeros, (slots,), jnp.int32)
  return DecodeState(
      cache=init_cache(model_cfg, slots, cache_len), step=jnp.zeros((), jnp.int32),
      row_keys_B=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), jnp.arange(slots)),
      prompt_len_B=zeros(), last_B=jnp.full((slots,), cfg.pad_id, jnp.int32), active_B=jnp.zeros((slots,), bool),
      tokens_BR=jnp.full((slots, R), cfg.pad_id, jnp.int32), mask_BR=jnp.zeros((slots, R), bool),
      behav_logp_BR=jnp.zeros((slots, R), jnp.float32),
      raw_logp_BR=jnp.zeros((slots, R), jnp.float32) if cfg.record_raw_logp else None,
      topk_ids_BRK=jnp.full((slots, R, K), cfg.pad_id, jnp.int32) if K else None,
      topk_logp_BRK=jnp.zeros((slots, R, K), jnp.float32) if K else None,
      finish_reason_B=jnp.full((slots,), FINISH_LENGTH, jnp.int32), length_B=zeros(), step_B=zeros())


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "mesh", "data_axis"), donate_argnames=("state",))
def admit(params: dict, state: DecodeState, prompt_BE: jax.Array, prompt_mask_BE: jax.Array, new_B: jax.Array,
          sample_B: jax.Array, key: jax.Array, start_B: jax.Array | None = None, keep_B: jax.Array | None = None,
          turn_B: jax.Array | None = None, budget_B: jax.Array | None = None, *, model_cfg: ModelConfig,
          cfg: SamplingConfig, mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Slots with new_B take sample sample_B[b] (its prompt right-aligned in prompt_BE); every running
  slot feeds its last token in the same forward; every slot that runs then samples its next token.

  Sample b draws with fold_in(key, b). An episode's turn (sampling/episode_slots.py) passes more:
  start_B, the RoPE position of the block's first token (None: 0, a prompt); keep_B, new slots that
  keep their cache (the block continues the context it holds; None: every new slot forgets); turn_B,
  then sample b's turn k draws with fold_in(fold_in(key, k), b), the lock-step rounds' key; budget_B,
  the most tokens the new turn may sample (the state must carry budgets)."""
  params = cast_params(params, cfg.dtype)
  state = shard_rows(state, mesh, data_axis)
  B, E = prompt_BE.shape
  running_B = state.active_B & ~new_B
  last_E = jnp.arange(E) == E - 1
  # The block: a new slot's prompt; a running slot's last token at the end; an idle one nothing (its
  # queries see no key and give zeros, not recorded; its cache, an episode's between turns, is kept).
  tokens_BE = jnp.where(new_B[:, None], prompt_BE, jnp.where(last_E, state.last_B[:, None], cfg.pad_id))
  mask_BE = jnp.where(new_B[:, None], prompt_mask_BE, last_E[None, :] & running_B[:, None])
  counts_BE = jnp.cumsum(mask_BE.astype(jnp.int32), axis=1)
  start_B = jnp.zeros((B,), jnp.int32) if start_B is None else start_B
  own_B = jnp.where(running_B, state.prompt_len_B + state.step_B - 1, 0)  # the running slot's last token
  positions_BE = jnp.where(new_B[:, None], start_B[:, None] + counts_BE - 1, own_B[:, None])
  positions_BE = jnp.where(mask_BE, positions_BE, 0)
  forget_B = new_B if keep_B is None else new_B & ~keep_B
  cache = state.cache.replace(mask_BS=state.cache.mask_BS & ~forget_B[:, None])  # a new sample's slot forgets
  hidden_BED, cache = forward(params, model_cfg, tokens_BE.astype(jnp.int32), positions_BE, mask_BE, cache)
  logits_BV = logits(params, model_cfg, hidden_BED[:, -1:])[:, 0]

  def fresh(new, old, fill):  # a new slot's record starts empty
    shape = (B,) + (1,) * (old.ndim - 1)
    return jnp.where(new_B.reshape(shape), jnp.asarray(fill, old.dtype), old)

  fold_one, fold_each = (jax.vmap(jax.random.fold_in, in_axes=(axis, 0)) for axis in (None, 0))
  keys_B = jax.random.key_data(fold_one(key, sample_B) if turn_B is None
                               else fold_each(fold_one(key, turn_B), sample_B))
  budgets = {}
  if budget_B is not None:
    budgets["budget_B"] = jnp.where(new_B, budget_B, state.budget_B)
  state = state.replace(
      cache=cache,
      row_keys_B=jax.random.wrap_key_data(jnp.where(new_B[:, None], keys_B, jax.random.key_data(state.row_keys_B))),
      prompt_len_B=jnp.where(new_B, start_B + counts_BE[:, -1], state.prompt_len_B),
      active_B=running_B | new_B,
      step_B=jnp.where(new_B, 0, state.step_B),
      tokens_BR=fresh(new_B, state.tokens_BR, cfg.pad_id), mask_BR=fresh(new_B, state.mask_BR, False),
      behav_logp_BR=fresh(new_B, state.behav_logp_BR, 0.0),
      raw_logp_BR=None if state.raw_logp_BR is None else fresh(new_B, state.raw_logp_BR, 0.0),
      topk_ids_BRK=None if state.topk_ids_BRK is None else fresh(new_B, state.topk_ids_BRK, cfg.pad_id),
      topk_logp_BRK=None if state.topk_logp_BRK is None else fresh(new_B, state.topk_logp_BRK, 0.0),
      finish_reason_B=jnp.where(new_B, FINISH_LENGTH, state.finish_reason_B),
      length_B=jnp.where(new_B, 0, state.length_B), **budgets)
  return shard_rows(record_sample(state, logits_BV, cfg), mesh, data_axis)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "chunk", "mesh", "data_axis"),
                   donate_argnames=("state",))
def decode_chunk(params: dict, state: DecodeState, *, model_cfg: ModelConfig, cfg: SamplingConfig,
                 chunk: int, mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Up to `chunk` decode steps (fewer when every slot has ended)."""
  params = unstack_layers(cast_params(params, cfg.dtype))
  body = functools.partial(decode_step, params, model_cfg=model_cfg, cfg=cfg, mesh=mesh, data_axis=data_axis)
  start = state.step
  cond = lambda s: (s.step - start < chunk) & jnp.any(s.active_B)  # noqa: E731
  return lax.while_loop(cond, body, state)


@functools.partial(jax.jit, static_argnames=("mesh", "data_axis"), donate_argnames=("state",))
def compact(state: DecodeState, *, mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Each row's valid cache slots moved to the front, in order; the next slot to write after the
  longest row's."""
  cache: KVCache = state.cache
  order_BS = jnp.argsort(~cache.mask_BS, axis=1, stable=True).astype(jnp.int32)
  count_B = cache.mask_BS.sum(axis=1).astype(jnp.int32)

  def gather(x, axis):
    idx = order_BS.reshape(order_BS.shape[:1] + (1,) * (axis - 1) + order_BS.shape[1:] + (1,) * (x.ndim - axis - 1))
    return jnp.take_along_axis(x, idx, axis=axis)

  cache = cache.replace(
      k_BKHS=tuple(gather(k, 3) for k in cache.k_BKHS), v_BKSH=tuple(gather(v, 2) for v in cache.v_BKSH),
      mask_BS=jnp.arange(cache.length)[None, :] < count_B[:, None], index=count_B.max(),
      positions_BS=None if cache.positions_BS is None else gather(cache.positions_BS, 1))
  return shard_rows(state.replace(cache=cache), mesh, data_axis)


def generate_continuous(params: dict, model_cfg: ModelConfig, prompt_tokens_BP, prompt_mask_BP,
                        cfg: SamplingConfig, key: jax.Array, *, slots: int, chunk: int = 16,
                        mesh: Mesh | None = None) -> Rollout:
  """The static sampler's `generate` with continuous batching (module docstring): the same Rollout
  (B = B0 x n_samples rows, a prompt's samples consecutive) and, for the same key, the same tokens.

  slots: rows decoded at once (any number >= 1; fewer than B0 x n_samples to gain anything).
  chunk: decode steps between two looks at which samples ended.
  mesh: the slots (and the KV cache) split over its batch axes, as `generate` splits rows; `slots`
    must divide evenly.
  """
  if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
    raise ValueError(f"generate_continuous: slots={slots!r} must be an int >= 1")
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"generate_continuous: chunk={chunk!r} must be an int >= 1")
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)  # a raw uint32 key: the same draws, typed
  cfg.check_vocab(model_cfg.vocab_size)
  tokens_np, mask_np = np.asarray(prompt_tokens_BP), np.asarray(prompt_mask_BP).astype(bool)
  check_prompt_tokens(tokens_np, mask_np, model_cfg.vocab_size)
  B0, n, R, K = tokens_np.shape[0], cfg.n_samples, cfg.max_new_tokens, cfg.record_topk
  # Prompts right-aligned in a block of the padded width P.
  lengths = mask_np.sum(axis=1)
  P = int(tokens_np.shape[1])
  block = np.full((B0, P), cfg.pad_id, np.int32)
  block_mask = np.zeros((B0, P), bool)
  for i in range(B0):
    block[i, P - lengths[i]:], block_mask[i, P - lengths[i]:] = tokens_np[i][mask_np[i]], True
  data_axis, rows = (), None
  if mesh is not None:
    data_axis = resolve_data_axis(mesh, None)
    shards = int(np.prod([mesh.shape[a] for a in data_axis]))
    if slots % shards:
      raise ValueError(f"generate_continuous: slots={slots} do not split evenly over data_axis {data_axis!r} of "
                       f"size {shards}")
    rows = NamedSharding(mesh, PartitionSpec(data_axis))
  placed = functools.partial(jax.device_put, device=rows) if rows is not None else (lambda x: x)
  on_mesh = dict(mesh=mesh, data_axis=data_axis)
  run_cfg = sampler_model_config(model_cfg, cfg)
  S = 2 * P + R + chunk
  state = idle_state(run_cfg, cfg, slots, S)
  queue = collections.deque(range(B0 * n))
  holder = [-1] * slots  # the sample each slot holds (-1: none)
  out = {name: np.zeros(shape, dtype) for name, shape, dtype in (
      ("tokens", (B0 * n, R), np.int32), ("mask", (B0 * n, R), bool), ("logp", (B0 * n, R), np.float32),
      ("raw", (B0 * n, R), np.float32), ("topk_ids", (B0 * n, R, K), np.int32),
      ("topk_logp", (B0 * n, R, K), np.float32), ("finish", (B0 * n,), np.int32), ("length", (B0 * n,), np.int32))}
  out["tokens"][:] = cfg.pad_id
  out["topk_ids"][:] = cfg.pad_id
  active = np.zeros((slots,), bool)
  while True:
    ended = [s for s in range(slots) if holder[s] >= 0 and not active[s]]
    if ended:
      rec = sharding_lib.fetch((state.tokens_BR, state.mask_BR, state.behav_logp_BR, state.raw_logp_BR,
                            state.topk_ids_BRK, state.topk_logp_BRK, state.finish_reason_B, state.length_B))
      for s in ended:
        b = holder[s]
        for name, arr in zip(("tokens", "mask", "logp", "raw", "topk_ids", "topk_logp", "finish", "length"), rec):
          if arr is not None:
            out[name][b] = arr[s]
        holder[s] = -1
    free = [s for s in range(slots) if holder[s] < 0]
    if not queue and len(free) == slots:
      break
    if int(state.cache.index) + P + chunk > S:
      state = compact(state, **on_mesh)
    new_B = np.zeros((slots,), bool)
    sample_B = np.zeros((slots,), np.int32)
    prompt_BE = np.full((slots, P), cfg.pad_id, np.int32)
    prompt_mask_BE = np.zeros((slots, P), bool)
    for s in free:
      if not queue:
        break
      b = queue.popleft()
      holder[s], new_B[s], sample_B[s] = b, True, b
      prompt_BE[s], prompt_mask_BE[s] = block[b // n], block_mask[b // n]
    if new_B.any():
      state = admit(params, state, *placed((prompt_BE, prompt_mask_BE, new_B, sample_B)), key, model_cfg=run_cfg,
                    cfg=cfg, **on_mesh)
    state = decode_chunk(params, state, model_cfg=run_cfg, cfg=cfg, chunk=chunk, **on_mesh)
    active = np.asarray(sharding_lib.fetch(state.active_B))
    faults.point("decode_chunk")  # the reliability matrix: a kill with samples in the slots
  return Rollout(
      tokens_BR=jnp.asarray(out["tokens"]), mask_BR=jnp.asarray(out["mask"]),
      behav_logp_BR=jnp.asarray(out["logp"]), finish_reason_B=jnp.asarray(out["finish"]),
      length_B=jnp.asarray(out["length"]), prompt_index_B=jnp.asarray(np.arange(B0 * n, dtype=np.int32) // n),
      raw_logp_BR=jnp.asarray(out["raw"]) if cfg.record_raw_logp else None,
      topk_ids_BRK=jnp.asarray(out["topk_ids"]) if K else None,
      topk_logp_BRK=jnp.asarray(out["topk_logp"]) if K else None, sampling=cfg)
