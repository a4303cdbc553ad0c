"""Continuous batching: a fixed number of slots, each taking the next queued sample when its own ends.

The static sampler (sampling/generate.py) decodes a batch until its longest row ends; with
long-tailed response lengths most rows then idle for most of the loop. Here the B0 x n_samples
samples of a call queue for `slots` rows of one decode state, and the loop runs in chunks:

    admit:  the slots whose sample ended (or that never had one) take the next queued samples: their
            prompts are encoded as one block of those rows only (jitted `admit`: the rows gathered
            from the decode state, encoded, their token 0 sampled, and scattered back; the running
            slots wait for the next decode step);
    decode: `chunk` decode steps (jitted `decode_chunk`); a row that ends idles until the chunk's
            end: end of sequence is looked at on the host once per chunk, not per step;
    read:   the ended samples' records are copied out, and when the cache has no room left for a
            block and a chunk, its valid slots are moved to the front of each row (`compact`).

Shapes are static: the slots, the cache's S = 2 P + R + chunk slots (P the padded prompt width), the
record's R columns; an admission's rows are padded to a few sizes (`admitted_rows`). The KV cache's
slots need not be contiguous per row (attention reads the valid ones, RoPE takes each token's own
position), so a slot that takes a new sample only marks its old slots invalid.

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
from jax.sharding import Mesh

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


def _rows_of(state: DecodeState, rows_N: jax.Array) -> DecodeState:
  """The rows `rows_N` of every per-row buffer (the cache's too); an index past the last row reads the
  last (a padding entry: computed, then dropped by `_put_rows`)."""
  take = lambda x: jnp.take(x, rows_N, axis=0, mode="clip")  # noqa: E731
  changes = {name: take(x) for name, x in state.per_row().items()}
  changes["row_keys_B"] = jax.random.wrap_key_data(take(jax.random.key_data(state.row_keys_B)))
  return state.replace(cache=state.cache.map_rows(take), **changes)


def _put_rows(state: DecodeState, sub: DecodeState, rows_N: jax.Array) -> DecodeState:
  """`state` with rows `rows_N` replaced by `sub`'s (an index past the last row is dropped)."""
  put = lambda x, y: x.at[rows_N].set(y, mode="drop")  # noqa: E731
  changes = {name: put(x, getattr(sub, name)) for name, x in state.per_row().items()}
  changes["row_keys_B"] = jax.random.wrap_key_data(
      put(jax.random.key_data(state.row_keys_B), jax.random.key_data(sub.row_keys_B)))
  c, sc = state.cache, sub.cache
  cache = c.replace(k_BKHS=tuple(put(k, sk) for k, sk in zip(c.k_BKHS, sc.k_BKHS)),
                    v_BKSH=tuple(put(v, sv) for v, sv in zip(c.v_BKSH, sc.v_BKSH)),
                    mask_BS=put(c.mask_BS, sc.mask_BS), index=sc.index,
                    positions_BS=None if c.positions_BS is None else put(c.positions_BS, sc.positions_BS))
  return state.replace(cache=cache, **changes)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "mesh", "data_axis"), donate_argnames=("state",))
def admit(params: dict, state: DecodeState, prompt_NE: jax.Array, prompt_mask_NE: jax.Array, rows_N: jax.Array,
          sample_N: jax.Array, key: jax.Array, start_N: jax.Array | None = None, keep_N: jax.Array | None = None,
          turn_N: jax.Array | None = None, budget_N: jax.Array | None = None, *, model_cfg: ModelConfig,
          cfg: SamplingConfig, mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Slot rows_N[n] takes sample sample_N[n], its prompt right-aligned in prompt_NE, and samples its
  token 0. Only the admitted rows are computed (a forward over N x E tokens, not every slot's): the
  running slots wait for the next decode step, whose keys and positions are their own, so their
  tokens do not change. An entry rows_N[n] >= slots is padding (N is rounded up to a few sizes, so
  that `admit` compiles for a few shapes), computed and dropped. The block is written to the cache's
  slots [index, index + E) of the admitted rows; the other rows' slots there stay invalid.

  Sample b draws with fold_in(key, b). An episode's turn (sampling/episode_slots.py) passes more:
  start_N, the RoPE position of the block's first token (None: 0, a prompt); keep_N, rows that keep
  their cache (the block continues the context it holds; None: every admitted row forgets its old
  sample); turn_N, then sample b's turn k draws with fold_in(fold_in(key, k), b), the lock-step
  rounds' key; budget_N, the most tokens the new turn may sample (the state must carry budgets)."""
  params = cast_params(params, cfg.dtype)
  state = shard_rows(state, mesh, data_axis)
  N, E = prompt_NE.shape
  R, K = cfg.max_new_tokens, cfg.record_topk
  sub = _rows_of(state, rows_N)
  counts_NE = jnp.cumsum(prompt_mask_NE.astype(jnp.int32), axis=1)
  start_N = jnp.zeros((N,), jnp.int32) if start_N is None else start_N
  positions_NE = jnp.where(prompt_mask_NE, start_N[:, None] + counts_NE - 1, 0)
  kept_NS = sub.cache.mask_BS & (jnp.zeros((N, 1), bool) if keep_N is None else keep_N[:, None])
  cache = sub.cache.replace(mask_BS=kept_NS)  # a new sample's slot forgets; an episode's next turn keeps it
  hidden_NED, cache = forward(params, model_cfg, prompt_NE.astype(jnp.int32), positions_NE,
                              prompt_mask_NE.astype(jnp.bool_), cache)
  logits_NV = logits(params, model_cfg, hidden_NED[:, -1:])[:, 0]
  fold_one, fold_each = (jax.vmap(jax.random.fold_in, in_axes=(axis, 0)) for axis in (None, 0))
  keys_N = fold_one(key, sample_N) if turn_N is None else fold_each(fold_one(key, turn_N), sample_N)
  zeros = jnp.zeros((N,), jnp.int32)
  sub = sub.replace(
      cache=cache, row_keys_B=keys_N, prompt_len_B=start_N + counts_NE[:, -1],
      last_B=jnp.full((N,), cfg.pad_id, jnp.int32), active_B=jnp.ones((N,), bool), step_B=zeros,
      tokens_BR=jnp.full((N, R), cfg.pad_id, jnp.int32), mask_BR=jnp.zeros((N, R), bool),
      behav_logp_BR=jnp.zeros((N, R), jnp.float32),
      raw_logp_BR=None if state.raw_logp_BR is None else jnp.zeros((N, R), jnp.float32),
      topk_ids_BRK=None if state.topk_ids_BRK is None else jnp.full((N, R, K), cfg.pad_id, jnp.int32),
      topk_logp_BRK=None if state.topk_logp_BRK is None else jnp.zeros((N, R, K), jnp.float32),
      finish_reason_B=jnp.full((N,), FINISH_LENGTH, jnp.int32), length_B=zeros,
      budget_B=None if state.budget_B is None else (budget_N if budget_N is not None else sub.budget_B))
  sub = record_sample(sub, logits_NV, cfg)
  return shard_rows(_put_rows(state, sub.replace(step=state.step), rows_N), mesh, data_axis)


def admitted_rows(n: int, slots: int, shards: int = 1) -> int:
  """The padded number of rows of an admission of n: slots / 8 doubled until n fits (a multiple of the
  mesh's batch shards), at most the slots; so `admit` compiles for at most four row counts."""
  size = max(shards, slots // 8, 1)
  while size < n:
    size *= 2
  return min(size, slots)


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
  data_axis, shards = (), 1
  if mesh is not None:
    data_axis = resolve_data_axis(mesh, None)
    shards = int(np.prod([mesh.shape[a] for a in data_axis]))
    if slots % shards:
      raise ValueError(f"generate_continuous: slots={slots} do not split evenly over data_axis {data_axis!r} of "
                       f"size {shards}")
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
    taking = free[:len(queue)]
    if taking:
      N = admitted_rows(len(taking), slots, shards)
      rows_N = np.full((N,), slots, np.int32)  # padding past the last slot: dropped
      sample_N = np.zeros((N,), np.int32)
      prompt_NE, prompt_mask_NE = np.full((N, P), cfg.pad_id, np.int32), np.zeros((N, P), bool)
      for i, s in enumerate(taking):
        b = queue.popleft()
        holder[s], rows_N[i], sample_N[i] = b, s, b
        prompt_NE[i], prompt_mask_NE[i] = block[b // n], block_mask[b // n]
      state = admit(params, state, prompt_NE, prompt_mask_NE, rows_N, sample_N, key, model_cfg=run_cfg, cfg=cfg,
                    **on_mesh)
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
