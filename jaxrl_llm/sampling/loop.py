"""Prefill and decode: the two jitted halves of the sampler.

prefill: one forward over the padded prompts fills the KV cache, the cache is
repeated n_samples times along the batch (a group's rows share their prompt's
keys and values, so the prompt is encoded once per group), and token 0 is
sampled from the last real prompt position.

decode: a `lax.while_loop` that feeds the previous token through the model
(one cache slot per step, shared by all rows), samples the next, and stops as
soon as every row has finished or R tokens are out.

Slots vs positions: prompt slots are [0, P) whatever the padding side; padding
slots are never valid. Response token t sits in slot P + t and has RoPE
position prompt_len_B + t, so left, right or mixed padding give the same
tokens as an unpadded prompt.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.model import KVCache, forward, init_cache, logits, unstack_layers
from jaxrl_llm.model.config import ModelConfig
from jaxrl_llm.model.sharding import LOGICAL_RULES
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.processors import gather_logp, last_true, process_logits, sample_from_logp
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, Rollout


@struct.dataclass
class DecodeState:
  """The while-loop carry. B = prompts x n_samples, R = max_new_tokens, K = record_topk."""

  cache: KVCache  # per layer k [B, K_kv, H, S], v [B, K_kv, S, H]; mask_BS; index = next slot
  step: jax.Array  # [] int32: number of tokens sampled so far
  row_keys_B: jax.Array  # [B] PRNG keys, one stream per row
  prompt_len_B: jax.Array  # [B] int32 real prompt tokens (RoPE position of response token 0)
  last_B: jax.Array  # [B] int32 token sampled at step - 1 (fed at the next forward)
  active_B: jax.Array  # [B] bool: row has not finished
  tokens_BR: jax.Array  # [B, R] int32
  mask_BR: jax.Array  # [B, R] bool
  behav_logp_BR: jax.Array  # [B, R] f32
  raw_logp_BR: jax.Array | None  # [B, R] f32 or None
  topk_ids_BRK: jax.Array | None  # [B, R, K] int32 or None
  topk_logp_BRK: jax.Array | None  # [B, R, K] f32 or None
  finish_reason_B: jax.Array  # [B] int32 (FINISH_LENGTH until decided)
  length_B: jax.Array  # [B] int32
  budget_B: jax.Array | None = None  # [B] int32 tokens the row may sample, <= R (one turn of an episode); None: R
  step_B: jax.Array | None = None  # [B] int32 each row's own step (continuous batching: sampling/continuous.py); None: `step`

  def per_row(self) -> dict:
    """{name: buffer} of every per-row buffer but the cache's (rows on axis 0), None fields left out."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name.endswith(("_B", "_BR", "_BRK")) and getattr(self, f.name) is not None}


def shard_rows(state: DecodeState, mesh: Mesh | None, data_axis: tuple[str, ...]) -> DecodeState:
  """Constrains every per-row buffer to be split by rows over `data_axis`.

  Rows are independent, so each device decodes its own rows against its slice
  of the cache; the cache's kv-heads follow the model's rule (tensor axis),
  as in model.sharding.cache_sharding.
  """
  if mesh is None:
    return state

  def rows(x, dim, *rest):
    return lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*([None] * dim), data_axis, *rest)))

  kv_axis = LOGICAL_RULES["kv_heads"]
  kv_axis = kv_axis if kv_axis in mesh.axis_names else None
  changes = {name: rows(x, 0) for name, x in state.per_row().items()}
  cache = state.cache.map_rows(
      lambda x: rows(x, 0, kv_axis, None, None) if x.ndim == 4 else rows(x, 0))
  return state.replace(cache=cache, **changes)


def cast_params(params: dict, dtype: str | None) -> dict:
  """Floating leaves cast to `dtype` (None: unchanged); integer leaves kept."""
  if dtype is None:
    return params
  dt = jnp.dtype(dtype)
  return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def _column(buf, col, t):
  """buf with column t (axis 1) replaced by col; t a scalar, or [B] (row b's column t[b]; a column
  past the end is dropped)."""
  if jnp.ndim(t):
    return buf.at[jnp.arange(buf.shape[0]), t].set(col.astype(buf.dtype), mode="drop")
  start = (0, t) + (0,) * (buf.ndim - 2)
  return lax.dynamic_update_slice(buf, jnp.expand_dims(col, 1).astype(buf.dtype), start)


def _ends_with(tokens_BR: jax.Array, tok_B: jax.Array, t: jax.Array, seq: tuple[int, ...]) -> jax.Array:
  """bool [B]: the row's sampled tokens, tok_B at step t after tokens_BR[:, :t], end with `seq` (t a
  scalar or [B])."""
  match_B = tok_B == seq[-1]
  for j, want in enumerate(reversed(seq[:-1]), start=1):
    if jnp.ndim(t):
      prev_B = jnp.take_along_axis(tokens_BR, jnp.maximum(t - j, 0)[:, None], axis=1)[:, 0]
    else:
      prev_B = lax.dynamic_index_in_dim(tokens_BR, jnp.maximum(t - j, 0), axis=1, keepdims=False)
    match_B = match_B & (prev_B == want) & (t >= j)
  return match_B


def record_sample(state: DecodeState, logits_BV: jax.Array, cfg: SamplingConfig) -> DecodeState:
  """Samples token `state.step` (row b's `state.step_B[b]` when set) from logits_BV and writes it into
  the record."""
  t = state.step if state.step_B is None else state.step_B
  R = state.tokens_BR.shape[1]
  active_B = state.active_B
  if 0 < cfg.vocab_limit < logits_BV.shape[-1]:  # padded rows: the tokenizer has no such ids
    logits_BV = jnp.where(jnp.arange(logits_BV.shape[-1]) < cfg.vocab_limit, logits_BV, -jnp.inf)
  logp_BV = process_logits(logits_BV, temperature=cfg.temperature, top_k=cfg.top_k,
                           top_p=cfg.top_p, min_p=cfg.min_p)
  if cfg.greedy:
    tok_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  else:
    step_keys_B = jax.vmap(jax.random.fold_in, in_axes=(0, 0 if jnp.ndim(t) else None))(state.row_keys_B, t)
    tok_B = sample_from_logp(step_keys_B, logp_BV)
  tok_B = jnp.where(active_B, tok_B, cfg.pad_id)
  zero = jnp.zeros((), jnp.float32)
  updates = dict(
      tokens_BR=_column(state.tokens_BR, tok_B, t),
      mask_BR=_column(state.mask_BR, active_B, t),
      behav_logp_BR=_column(state.behav_logp_BR, jnp.where(active_B, gather_logp(logp_BV, tok_B), zero), t),
  )
  if state.raw_logp_BR is not None:
    raw_B = gather_logp(jax.nn.log_softmax(logits_BV.astype(jnp.float32), axis=-1), tok_B)
    updates["raw_logp_BR"] = _column(state.raw_logp_BR, jnp.where(active_B, raw_B, zero), t)
  if state.topk_ids_BRK is not None:
    # Ids by the raw logits (mu's order on its support; informative under greedy
    # too), log-probs under mu (-inf where truncated away).
    _, ids_BK = lax.top_k(logits_BV, cfg.record_topk)
    lp_BK = jnp.take_along_axis(logp_BV, ids_BK, axis=-1)
    active_B1 = active_B[:, None]
    updates["topk_ids_BRK"] = _column(state.topk_ids_BRK, jnp.where(active_B1, ids_BK, cfg.pad_id), t)
    updates["topk_logp_BRK"] = _column(state.topk_logp_BRK, jnp.where(active_B1, lp_BK, zero), t)
  is_eos_B = jnp.isin(tok_B, jnp.asarray(cfg.eos_ids, jnp.int32)) if cfg.eos_ids else jnp.zeros_like(active_B)
  is_stop_B = jnp.isin(tok_B, jnp.asarray(cfg.stop_ids, jnp.int32)) if cfg.stop_ids else jnp.zeros_like(active_B)
  for seq in cfg.stop_sequences:  # a multi-token stop string: compared with the row's last len(seq) tokens
    is_stop_B = is_stop_B | _ends_with(state.tokens_BR, tok_B, t, seq)
  reason_B = jnp.where(is_eos_B, FINISH_EOS, jnp.where(is_stop_B, FINISH_STOP, FINISH_LENGTH))
  at_length_B = t == R - 1
  if state.budget_B is not None:  # a row's own limit (the turn budget of its episode), "length" too
    at_length_B = at_length_B | (t + 1 >= state.budget_B)
  ends_B = active_B & (is_eos_B | is_stop_B | at_length_B)
  if state.step_B is not None:  # a row's step moves while it samples
    updates["step_B"] = t + active_B.astype(jnp.int32)
  return state.replace(
      step=state.step + 1,
      last_B=tok_B,
      active_B=active_B & ~ends_B,
      finish_reason_B=jnp.where(ends_B, reason_B, state.finish_reason_B),
      length_B=state.length_B + active_B.astype(jnp.int32),
      **updates,
  )


def prompt_positions(prompt_mask_BP: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(positions_BP, prompt_len_B, last_index_B) for any padding layout.

  A real token's position counts the real tokens before it; padding gets 0
  (never attended). last_index_B is the slot of the last real token.
  """
  mask_BP = prompt_mask_BP.astype(jnp.bool_)
  counts_BP = jnp.cumsum(mask_BP.astype(jnp.int32), axis=1)
  positions_BP = jnp.where(mask_BP, counts_BP - 1, 0)
  last_index_B = last_true(mask_BP)
  return positions_BP, counts_BP[:, -1], last_index_B


def start_state(cache: KVCache, logits_B0V: jax.Array, prompt_len_B0: jax.Array, key: jax.Array,
                budget_B0: jax.Array | None, *, cfg: SamplingConfig, mesh: Mesh | None = None,
                data_axis: tuple[str, ...] = ()) -> DecodeState:
  """The decode state after encoding B0 contexts: their cache and next-token logits repeated n_samples
  times (group g's rows are g*n .. g*n + n - 1), token 0 sampled. prompt_len_B0: the RoPE position of
  each context's next token; budget_B0: the most tokens its rows may sample (None: R)."""
  B0 = prompt_len_B0.shape[0]
  n = cfg.n_samples
  B, R = B0 * n, cfg.max_new_tokens
  rep = functools.partial(jnp.repeat, repeats=n, axis=0, total_repeat_length=B)
  K = cfg.record_topk
  state = DecodeState(
      cache=cache.map_rows(rep),
      step=jnp.zeros((), jnp.int32),
      row_keys_B=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(B, dtype=jnp.int32)),
      prompt_len_B=rep(prompt_len_B0),
      last_B=jnp.full((B,), cfg.pad_id, jnp.int32),
      active_B=jnp.ones((B,), jnp.bool_),
      tokens_BR=jnp.full((B, R), cfg.pad_id, jnp.int32),
      mask_BR=jnp.zeros((B, R), jnp.bool_),
      behav_logp_BR=jnp.zeros((B, R), jnp.float32),
      raw_logp_BR=jnp.zeros((B, R), jnp.float32) if cfg.record_raw_logp else None,
      topk_ids_BRK=jnp.full((B, R, K), cfg.pad_id, jnp.int32) if K else None,
      topk_logp_BRK=jnp.zeros((B, R, K), jnp.float32) if K else None,
      finish_reason_B=jnp.full((B,), FINISH_LENGTH, jnp.int32),
      length_B=jnp.zeros((B,), jnp.int32),
      budget_B=None if budget_B0 is None else rep(budget_B0.astype(jnp.int32)),
  )
  return shard_rows(record_sample(shard_rows(state, mesh, data_axis), rep(logits_B0V), cfg), mesh, data_axis)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "cache_len", "mesh", "data_axis"))
def prefill(params: dict, prompt_tokens_BP: jax.Array, prompt_mask_BP: jax.Array, key: jax.Array,
            budget_B: jax.Array | None = None, *, model_cfg: ModelConfig, cfg: SamplingConfig, cache_len: int,
            mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Encodes B0 prompts, repeats them n_samples times, samples token 0.

  budget_B: [B0] int32, the most tokens each prompt's rows may sample (in [1, R]); None: R for all.
  """
  params = cast_params(params, cfg.dtype)
  B0, _ = prompt_tokens_BP.shape
  positions_BP, prompt_len_B, last_index_B = prompt_positions(prompt_mask_BP)
  cache = init_cache(model_cfg, B0, cache_len)
  hidden_BPD, cache = forward(params, model_cfg, prompt_tokens_BP.astype(jnp.int32), positions_BP,
                              prompt_mask_BP.astype(jnp.bool_), cache)
  hidden_B1D = jnp.take_along_axis(hidden_BPD, last_index_B[:, None, None], axis=1)
  logits_BV = logits(params, model_cfg, hidden_B1D)[:, 0]
  return start_state(cache, logits_BV, prompt_len_B, key, budget_B, cfg=cfg, mesh=mesh, data_axis=data_axis)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "cache_len", "mesh", "data_axis"))
def extend(params: dict, cache: KVCache | None, tokens_BE: jax.Array, mask_BE: jax.Array, start_B: jax.Array,
           drop_BS: jax.Array | None, key: jax.Array, budget_B: jax.Array, *, model_cfg: ModelConfig,
           cfg: SamplingConfig, cache_len: int, mesh: Mesh | None = None,
           data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Appends a block of new tokens to each row's kept cache and samples the row's next token 0: the
  next turn of a multi-turn episode without encoding its history again (sampling/turns.py).

  cache: the cache of the rows' previous decode (None: a fresh one, the block is each row's whole
  context), grown (or made) to `cache_len` slots; drop_BS: bool [B, S_old], slots that no longer
  belong to the row's context (tokens sampled after a host-side cut), marked invalid first (None:
  none). tokens_BE / mask_BE: the new tokens, any padding layout, written to slots [index, index + E);
  start_B: the RoPE position of each row's first new token (its tokens already in the cache).
  cfg.n_samples must be 1: row b continues its own context.
  """
  params = cast_params(params, cfg.dtype)
  B, _ = tokens_BE.shape
  if cache is None:
    cache = init_cache(model_cfg, B, cache_len)
  else:
    if drop_BS is not None:
      cache = cache.replace(mask_BS=cache.mask_BS & ~drop_BS)
    cache = cache.resize(cache_len)
  offsets_BE, count_B, last_index_B = prompt_positions(mask_BE)
  positions_BE = jnp.where(mask_BE, start_B[:, None] + offsets_BE, 0)
  hidden_BED, cache = forward(params, model_cfg, tokens_BE.astype(jnp.int32), positions_BE,
                              mask_BE.astype(jnp.bool_), cache)
  hidden_B1D = jnp.take_along_axis(hidden_BED, last_index_B[:, None, None], axis=1)
  logits_BV = logits(params, model_cfg, hidden_B1D)[:, 0]
  return start_state(cache, logits_BV, start_B + count_B, key, budget_B, cfg=cfg, mesh=mesh, data_axis=data_axis)


# Decode runs in a few segments, each a while_loop over a cache cut to the
# slots it can reach: attention reads (and masks) every cache slot at every
# step, so a query at slot P + t pays for only a static prefix just past
# P + t instead of all S slots (about 1/3 less attention work at 4 segments).
# Each segment is one more compiled copy of the loop body (whose L layers are
# unrolled), so more segments cost compile time; between segments the cache
# is padded (one copy of it per boundary, not per step). 4 keeps more of the
# saving for long responses than 2; the compile times and speeds of 1, 2 and
# 4 segments are in docs/benchmarks.md ("Sampler", scripts/bench_sampler.py).
_SEGMENTS = 4


def segment_lengths(prompt_len: int, max_new_tokens: int, cache_len: int,
                    segments: int = _SEGMENTS) -> tuple[int, ...]:
  """Cache lengths of the decode segments, increasing, the last = cache_len.

  Step t (1 <= t < R) writes slot P + t - 1; a segment of length L runs while
  the next slot to write is < L, so every length is > P (keeps the prompt).
  """
  lengths = [min(cache_len, prompt_len + -(-max_new_tokens * i // segments))
             for i in range(1, segments)]
  return tuple(sorted(set(lengths) | {cache_len}))


def decode_step(params: dict, s: DecodeState, *, model_cfg: ModelConfig, cfg: SamplingConfig,
                mesh: Mesh | None = None, data_axis: tuple[str, ...] = ()) -> DecodeState:
  """One step of the decode loop: feeds the last token, samples the next. `params` as the loop
  holds them (unstacked, in the sampler's dtype)."""
  # The token sampled at step - 1 goes into slot P + step - 1 at position
  # prompt_len + step - 1; finished rows feed padding that no query attends.
  positions_B1 = (s.prompt_len_B + (s.step if s.step_B is None else s.step_B) - 1)[:, None]
  hidden_B1D, cache = forward(params, model_cfg, s.last_B[:, None], positions_B1, s.active_B[:, None], s.cache)
  logits_BV = logits(params, model_cfg, hidden_B1D)[:, 0]
  return shard_rows(record_sample(s.replace(cache=cache), logits_BV, cfg), mesh, data_axis)


# The state is donated and returned: the loop writes the cache and the record
# buffers in place, where without donation XLA would first copy the
# KV cache (the sampler's largest buffers) out of the caller's.
@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "prompt_len", "mesh", "data_axis"),
                   donate_argnames=("state",))
def decode(params: dict, state: DecodeState, *, model_cfg: ModelConfig, cfg: SamplingConfig,
           prompt_len: int | None = None, mesh: Mesh | None = None,
           data_axis: tuple[str, ...] = ()) -> DecodeState:
  """Runs the decode loop until every row has finished or R tokens are out.

  prompt_len is P, the padded prompt length (the first response slot); with
  it the loop runs in segments over growing cache prefixes (same tokens,
  less attention work), without it in one loop over all S slots.
  """
  # Per-layer weights sliced out once, here, not inside the loop at every step.
  params = unstack_layers(cast_params(params, cfg.dtype))
  R = cfg.max_new_tokens
  S = state.cache.length

  body = functools.partial(decode_step, params, model_cfg=model_cfg, cfg=cfg, mesh=mesh, data_axis=data_axis)

  lengths = (S,) if prompt_len is None else segment_lengths(prompt_len, R, S)
  for length in lengths:
    state = shard_rows(state.replace(cache=state.cache.resize(length)), mesh, data_axis)
    cond = lambda s, length=length: (s.step < R) & jnp.any(s.active_B) & (s.cache.index < length)
    state = lax.while_loop(cond, body, state)
  return state


def to_rollout(state: DecodeState, cfg: SamplingConfig) -> Rollout:
  """The record of a finished decode (no computation: a view of the buffers)."""
  B = state.tokens_BR.shape[0]
  return Rollout(
      tokens_BR=state.tokens_BR,
      mask_BR=state.mask_BR,
      behav_logp_BR=state.behav_logp_BR,
      finish_reason_B=state.finish_reason_B,
      length_B=state.length_B,
      prompt_index_B=jnp.asarray(np.arange(B, dtype=np.int32) // cfg.n_samples),
      raw_logp_BR=state.raw_logp_BR,
      topk_ids_BRK=state.topk_ids_BRK,
      topk_logp_BRK=state.topk_logp_BRK,
      sampling=cfg,
  )
