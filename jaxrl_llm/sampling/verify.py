"""`rollout.exact`'s tokens: drawn from the trainer's full-sequence distribution, not the KV-cache
decode's (issue 43, item 2).

The built-in sampler draws token t of row b by inverse-CDF sampling with one uniform,
u(b, t) = uniform(fold_in(fold_in(key, b), t)), from the decode step's distribution. That step runs
other matmul shapes and attention sums than the trainer's forward, so its distribution is the
trainer's to rounding only: about 1e-7 nats in f32, about 1e-3 in bf16 compute. With log mu
recorded by the trainer's program (sampling/exact.py), the tokens would then come from a slightly
other distribution than the log mu beside them.

Verification, the rule here: a sample is accepted when each of its tokens is the one the trainer's
distribution gives for the same uniform. The row-wise program that records log mu
(model/invariant.rowwise_logprobs: each row alone, [1, P + R]) also returns the full-sequence state
that predicts each response token; `head_draws` makes the logits from it, processes them as the
decode step does (vocabulary limit, temperature) and draws with the same uniforms. At a row's first
position t where the draw differs, the token is replaced by the draw, the row is decoded again
after it with the KV cache (`resume`, the same keys), and its chunk of rows is computed and
verified again (sampling/exact.py's ExactEngine). The loop ends when every row is accepted; each
round fixes at least one more position of each row it touches, so at most R rounds (few in bf16,
typically none in f32). Without a differing row it costs the head's product and the draws, not a
second forward.

What that gives, bit for bit: the tokens are a function of (prompt, key, params) through the
trainer's program only: the tokens an inverse-CDF sampler would draw from the row-wise full
forward, one full forward per token, with these uniforms. A token's position t never depends on
the tokens after it in that program (the causal mask adds exact zeros), so an accepted prefix stays
accepted. What is left: the probability of a token under inverse-CDF sampling is the width of its
interval of the f32 cumulative sum, which equals exp(log mu) to f32 rounding (about 1e-7), as for
any float sampler; and the draws come from the logits' f32 product, where log mu's kernel fuses
the product with the log-softmax (their difference is f32 rounding too, not the sampler's dtype).
With a vocabulary padded past the tokenizer's ids (SamplingConfig.vocab_limit) the draws are over
the tokenizer's ids, as the decode's, and log mu is the full softmax's, as the trainer's log pi:
the two differ by log(1 - the padded ids' mass).

Single-turn samples only (static and continuous batching): an episode's tokens are recorded
exactly (log mu) but not re-drawn, since re-drawing a turn would replay its environment.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import forward, init_cache, logits
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.sampling.loop import DecodeState, cast_params, decode, prompt_positions, record_sample, shard_rows
from jaxrl_llm.sampling.processors import process_logits, sample_from_logp
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP


# The draws' logits are made this many bytes at a time (f32 [C, V]).
LOGITS_BYTES = 1 << 28


def step_keys(key: jax.Array, rows: jax.Array, R: int) -> jax.Array:
  """[B, R] keys: row `rows[b]`'s key at step t, fold_in(fold_in(key, rows[b]), t), as the decode
  draws them (sampling/loop.start_state and record_sample; continuous.admit)."""
  row_keys_B = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows)
  return jax.vmap(lambda k: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(k, jnp.arange(R)))(row_keys_B)


@functools.partial(jax.jit, static_argnames=("R",))
def step_key_data(key: jax.Array, rows: jax.Array, R: int) -> jax.Array:
  """uint32 [B, R, 2]: `step_keys`' bits (head_draws takes them in chunks of rows)."""
  return jax.random.key_data(step_keys(key, rows, R))


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "shards", "logits_bytes"))
def head_draws(params, hidden_BRD, mask_BR, keys_BR, *, model_cfg, cfg: SamplingConfig, shards: int = 1,
               logits_bytes: int = LOGITS_BYTES) -> jax.Array:
  """int32 [B, R]: at each response position t, the token the decode's rule (vocabulary limit,
  temperature, inverse-CDF sampling) draws from the logits of hidden_BRD[b, t], the full forward's
  state that predicts token t (model/invariant.rowwise_logprobs' second output), with the uniform of
  keys_BR[b, t] (`step_key_data`); -1 off mask_BR. `params` in the sampler's dtype. Each row alone,
  in rowwise_logprobs' layout (map step b // shards, slot b % shards), its logits made
  `logits_bytes` at a time (f32 [C, V], C positions): a row's draws do not depend on the batch."""
  B, R, D = hidden_BRD.shape

  def draw(h_CD, k_C):  # one row's C positions
    logits_CV = logits(params, model_cfg, h_CD[None])[0]
    V = logits_CV.shape[-1]
    if 0 < cfg.vocab_limit < V:
      logits_CV = jnp.where(jnp.arange(V) < cfg.vocab_limit, logits_CV, -jnp.inf)
    if cfg.greedy:
      return jnp.argmax(logits_CV, axis=-1).astype(jnp.int32)
    logp_CV = process_logits(logits_CV, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                             min_p=cfg.min_p)
    return sample_from_logp(jax.random.wrap_key_data(k_C), logp_CV)

  C = min(R, max(1, logits_bytes // (4 * model_cfg.vocab_size)))
  n = -(-R // C)

  def one(args):  # the S rows of one map step (one per batch shard), each in chunks of C positions
    h_SRD, m_SR, k_SR = args
    S = h_SRD.shape[0]
    h_nSCD = jnp.pad(h_SRD, ((0, 0), (0, n * C - R), (0, 0))).reshape(S, n, C, D).swapaxes(0, 1)
    k_nSC = jnp.pad(k_SR, ((0, 0), (0, n * C - R), (0, 0))).reshape(S, n, C, -1).swapaxes(0, 1)
    draw_nSC = jax.lax.map(lambda a: jax.vmap(draw)(*a), (h_nSCD, k_nSC))
    return jnp.where(m_SR, draw_nSC.swapaxes(0, 1).reshape(S, n * C)[:, :R], -1)

  def steps(x):
    return x.reshape(B // shards, shards, *x.shape[1:])

  return jax.lax.map(one, tuple(steps(x) for x in (hidden_BRD, mask_BR, keys_BR))).reshape(B, R)


@functools.partial(jax.jit, static_argnames=("model_cfg", "cfg", "mesh", "data_axis"))
def resume(params, prompt_BP, prompt_mask_BP, tokens_BR, keep_B, rows_B, key, *, model_cfg, cfg: SamplingConfig,
           mesh=None, data_axis: tuple[str, ...] = ()) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Rows decoded again after their first keep_B[b] response tokens (1 <= keep_B < R), with the keys
  of rows rows_B of the original batch: the prompt and the kept tokens encoded as one block, then the
  decode loop from step keep_B (its rows split over `data_axis` of `mesh`, as the sampler's).
  -> (tokens_BR, mask_BR, finish_reason_B, length_B)."""
  params = cast_params(params, cfg.dtype)
  B, P = prompt_BP.shape
  R = tokens_BR.shape[1]
  kept_BR = jnp.arange(R)[None, :] < keep_B[:, None]
  tokens_BR = jnp.where(kept_BR, tokens_BR, cfg.pad_id)
  block_BE = jnp.concatenate([prompt_BP, tokens_BR], axis=1).astype(jnp.int32)
  mask_BE = jnp.concatenate([prompt_mask_BP.astype(bool), kept_BR], axis=1)
  positions_BE, count_B, last_index_B = prompt_positions(mask_BE)
  cache = init_cache(model_cfg, B, P + 2 * R)
  hidden_BED, cache = forward(params, model_cfg, block_BE, positions_BE, mask_BE, cache)
  hidden_B1D = jnp.take_along_axis(hidden_BED, last_index_B[:, None, None], axis=1)
  logits_BV = logits(params, model_cfg, hidden_B1D)[:, 0]
  state = DecodeState(
      cache=cache, step=jnp.zeros((), jnp.int32),
      row_keys_B=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows_B),
      prompt_len_B=count_B - keep_B, last_B=jnp.full((B,), cfg.pad_id, jnp.int32),
      active_B=jnp.ones((B,), bool), tokens_BR=tokens_BR, mask_BR=kept_BR,
      behav_logp_BR=jnp.zeros((B, R), jnp.float32), raw_logp_BR=None, topk_ids_BRK=None, topk_logp_BRK=None,
      finish_reason_B=jnp.full((B,), FINISH_LENGTH, jnp.int32), length_B=keep_B.astype(jnp.int32),
      step_B=keep_B.astype(jnp.int32))
  state = shard_rows(record_sample(shard_rows(state, mesh, data_axis), logits_BV, cfg), mesh, data_axis)
  state = decode(params, state, model_cfg=model_cfg, cfg=cfg, prompt_len=P + R, mesh=mesh, data_axis=data_axis)
  return state.tokens_BR, state.mask_BR, state.finish_reason_B, state.length_B


def forced_end(tokens: np.ndarray, t: int, cfg: SamplingConfig) -> int | None:
  """The finish reason when a row's token t (in `tokens`, its row) ends it, as record_sample decides;
  None: the row goes on."""
  tok = int(tokens[t])
  if tok in cfg.eos_ids:
    return FINISH_EOS
  if tok in cfg.stop_ids or any(t + 1 >= len(seq) and tuple(tokens[t + 1 - len(seq):t + 1]) == seq
                                for seq in cfg.stop_sequences):
    return FINISH_STOP
  if t == len(tokens) - 1:
    return FINISH_LENGTH
  return None
