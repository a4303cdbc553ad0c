"""`rollout.exact`: log mu recorded by the trainer's own program, so log mu == log pi_prox bit for bit
on-policy (issue 43, item 2).

The built-in sampler draws each token from a KV-cache decode step: a [B, 1] query over the cache,
matmuls of other shapes and attention sums over other lengths than the trainer's full-sequence
forward, so the log-prob it records differs from the trainer's log pi_prox of the same token in the
last bits (the default run: mismatch/log_c_abs_mean about 2e-7 in f32). With `rollout.exact` the
engine still samples the tokens with the KV cache, verifies single-turn rows against the
full-sequence program's draws with the same uniforms (a differing row is decoded again from its
first differing token: sampling/verify.py), then records log mu of the finished rows with
`model/invariant.rowwise_logprobs`, the batch-invariant program the trainer's recompute runs under
the same setting (training/recompute.py, RecomputeSpec.rowwise): same rows, params, dtype,
temperature and vocabulary kernels, each row alone, so neither the chunk, the rows' order, the
continuous slots that sampled them nor an episode's turns change a bit. On-policy (staleness 0, no
dtype or weight mismatch) log c = log pi_prox - log mu is then exactly 0.

What log mu means there: the full-sequence policy's probability of the sampled token, the
distribution the verified tokens are drawn from (to a float sampler's floor: sampling/verify.py).
With a deliberate mismatch (sampler_dtype, staleness, rollout.mismatch) log mu is the mismatched
policy's, recomputed the same way, and c carries that mismatch only. Truncated sampling (top_k,
top_p) and recorded top-k log-probs are refused by the config (the recompute is of the untruncated
softmax).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.invariant import rowwise_logprobs
from jaxrl_llm.sampling import verify
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.generate import resolve_data_axis, sampler_model_config
from jaxrl_llm.sampling.loop import cast_params
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH


def exact_logprobs(params, model_cfg, sampling_cfg, rows: RolloutBatch, *, impl: str, chunk: int,
                   batch_sharding=None) -> jax.Array:
  """f32 [B, R] on the device: log mu of `rows`' sampled tokens (0 elsewhere) under the sampler's
  `params` (its own, weight mismatch applied), cast as the sampler runs them, `chunk` rows per
  program placed with `batch_sharding`, by the trainer's row-wise program."""
  params = cast_params(params, sampling_cfg.dtype)
  shards = 1 if batch_sharding is None else sharding_lib.batch_shards(batch_sharding.mesh)
  static = exact_static(model_cfg, sampling_cfg, impl=impl, shards=shards)
  arrays = (rows.prompt_BP, rows.prompt_mask_BP, rows.tokens_BR, rows.context_BR, rows.mask_BR)
  outs = []
  for s in range(0, rows.tokens_BR.shape[0], chunk):
    args = tuple(a[s:s + chunk] for a in arrays)
    if batch_sharding is not None:
      args = sharding_lib.put(args, batch_sharding)
    outs.append(rowwise_logprobs(params, *args, **static)[0])
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _padded(n: int, shards: int) -> int:
  """Rows to run n rows in: the next power of two (few compiled shapes), a multiple of `shards`."""
  return -(-max(1 << (n - 1).bit_length(), shards) // shards) * shards


@jax.jit
def _set_rows(x_BR, idx_N, rows_NR):
  """x_BR with rows idx_N replaced by rows_NR (a repeated index: the same row again)."""
  return x_BR.at[idx_N].set(rows_NR)


def exact_static(model_cfg, sampling_cfg, *, impl: str, shards: int) -> dict:
  """The static arguments of `exact_logprobs`' program (model/invariant.rowwise_logprobs on params cast
  to the sampler's dtype): what the engine runs and the compile command lowers (tpu/programs.py)."""
  return dict(model_cfg=sampler_model_config(model_cfg, sampling_cfg), temperature=sampling_cfg.temperature,
              impl=impl, shards=shards)


def exact_chunk(batch_rows: int, micro_batch_size: int) -> int:
  """Rows per program of `exact_logprobs` for a batch of `batch_rows` rows (ExactEngine): the
  micro-batch where it divides the batch, else the whole batch."""
  return micro_batch_size if batch_rows % micro_batch_size == 0 else batch_rows


class ExactEngine:
  """A rollout engine whose `generate` is `inner`'s with log mu replaced by `exact_logprobs` under the
  weights of `sampler` (the built-in `JaxSampler` that `inner` is, or wraps: an EpisodeEngine)."""

  def __init__(self, inner, sampler, *, impl: str, chunk: int):
    self.inner, self.sampler, self.impl, self.chunk = inner, sampler, impl, chunk
    # The verification's counters since the engine started (as an external engine's requests): the
    # rounds that found a differing row, and the rows re-drawn.
    self.counts = {"exact/verify_rounds": 0.0, "exact/redrawn_rows": 0.0}

  @property
  def version(self) -> int:
    return self.inner.version

  def sync(self, params, version: int) -> None:
    self.inner.sync(params, version)

  def generate(self, prompts, key) -> RolloutBatch:
    batch = self.inner.generate(prompts, key)
    s = self.sampler
    chunk = exact_chunk(batch.tokens_BR.shape[0], self.chunk)
    # The trainer runs its steps with the mesh in context (the vocabulary ops read it); so does this
    # recompute, also from the background thread of rollout.overlap.
    mesh = s.batch_sharding.mesh if s.batch_sharding is not None else None
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None else contextlib.nullcontext():
      if batch.episodic:  # an episode's turns are recorded, not re-drawn (sampling/verify.py)
        behav_BR = exact_logprobs(s.params, s.model_cfg, s.sampling_cfg, batch, impl=self.impl, chunk=chunk,
                                  batch_sharding=s.batch_sharding)
      else:
        batch, behav_BR = self._verified(batch, key, chunk)
    return dataclasses.replace(batch, behav_logp_BR=behav_BR)

  def _verified(self, batch: RolloutBatch, key, chunk: int) -> tuple[RolloutBatch, jax.Array]:
    """(`batch` with each row's tokens those of the trainer's distribution for its uniforms, their log
    mu) (sampling/verify.py): the row-wise program's log-probs and hidden states of each chunk of rows,
    the draws from those states; the rows that differ re-drawn from their first differing token, and
    computed again, until none differs."""
    s = self.sampler
    cfg, model_cfg = s.sampling_cfg, sampler_model_config(s.model_cfg, s.sampling_cfg)
    params = cast_params(s.params, cfg.dtype)
    B, R = batch.tokens_BR.shape
    shards = 1 if s.batch_sharding is None else sharding_lib.batch_shards(s.batch_sharding.mesh)
    static = exact_static(s.model_cfg, cfg, impl=self.impl, shards=shards)
    keys_BR = verify.step_key_data(key, jnp.arange(B, dtype=jnp.int32), R)

    def run(idx):  # rows idx: (their log mu on the device, their draws on the host)
      args = self._placed(tuple(a[idx] for a in (batch.prompt_BP, batch.prompt_mask_BP, batch.tokens_BR,
                                                 batch.context_BR, batch.mask_BR)) + (keys_BR[idx],))
      logp, hidden = rowwise_logprobs(params, *args[:5], **static)
      hidden = self._placed(hidden)  # in the rows' sharding, as the plan lowers the draws (tpu/programs.py)
      return logp, np.asarray(sharding_lib.fetch(verify.head_draws(params, hidden, args[4], args[5],
                                                                   model_cfg=model_cfg, cfg=cfg, shards=shards)))

    ended = np.array([n == R or verify.forced_end(row, n - 1, cfg) is not None
                      for row, n in zip(batch.tokens_BR, batch.length_B)])
    if not ended.all():  # a row the decode's rules would have continued: not a proposal to verify
      raise ValueError(f"rollout.exact: rows {np.flatnonzero(~ended).tolist()} end before {R} tokens without an "
                       "end-of-sequence or stop token")
    parts = [run(np.arange(i, i + chunk)) for i in range(0, B, chunk)]
    logp_BR = parts[0][0] if len(parts) == 1 else jnp.concatenate([p[0] for p in parts])
    draws_BR = np.concatenate([p[1] for p in parts])
    accepted = np.zeros(B, np.int64)  # per row: the tokens verified so far
    while True:
      bad_BR = batch.mask_BR & (draws_BR != batch.tokens_BR)
      rows = np.flatnonzero(bad_BR.any(axis=1))
      if not rows.size:
        break
      first = bad_BR[rows].argmax(axis=1)
      if np.any(first < accepted[rows]):  # an accepted prefix is never re-drawn: a draw changed with the batch
        raise RuntimeError(f"rollout.exact: rows {rows[first < accepted[rows]].tolist()} differ before their "
                           "accepted tokens; the row-wise program is not batch-invariant here")
      accepted[rows] = first + 1
      self.counts["exact/verify_rounds"] += 1
      self.counts["exact/redrawn_rows"] += rows.size
      batch = self._redrawn(batch, rows, first, draws_BR, key, params, model_cfg)
      # Only the redrawn rows again (each row's numbers are its own: model/invariant.py), padded with
      # copies of the first (`_padded`).
      idx = np.concatenate([rows, np.full(_padded(rows.size, shards) - rows.size, rows[0])])
      logp_n, draws_n = run(idx)
      draws_BR[idx] = draws_n
      mesh = None if s.batch_sharding is None else s.batch_sharding.mesh
      at = np.asarray(idx, np.int32) if mesh is None else sharding_lib.put(np.asarray(idx, np.int32),
                                                                            sharding_lib.replicated(mesh))
      logp_BR = _set_rows(logp_BR, at, logp_n)
    return batch, logp_BR

  def _placed(self, args):
    s = self.sampler
    return args if s.batch_sharding is None else sharding_lib.put(args, s.batch_sharding)

  def _redrawn(self, batch, rows, first, draws_BR, key, params, model_cfg) -> RolloutBatch:
    """`batch` with row rows[i]'s token first[i] replaced by its draw, and the row decoded again after it."""
    cfg = self.sampler.sampling_cfg
    tokens, mask, length = batch.tokens_BR.copy(), batch.mask_BR.copy(), batch.length_B.copy()
    finish = np.where(batch.truncated_B, FINISH_LENGTH, FINISH_EOS)  # only LENGTH or not is kept
    go_on = []
    for b, t in zip(rows, first):
      tokens[b, t], tokens[b, t + 1:], mask[b, t + 1:], length[b] = draws_BR[b, t], cfg.pad_id, False, t + 1
      reason = verify.forced_end(tokens[b], t, cfg)
      if reason is None:
        go_on.append((b, t + 1))
      else:
        finish[b] = reason
    if go_on:
      idx = np.array([b for b, _ in go_on], np.int32)
      keep = np.array([k for _, k in go_on], np.int32)
      sharding = self.sampler.batch_sharding
      mesh = None if sharding is None else sharding.mesh
      shards = 1 if mesh is None else sharding_lib.batch_shards(mesh)
      # The rows padded (`_padded`) and split over the batch axes as the sampler's.
      n = _padded(len(idx), shards)
      pad = np.concatenate([np.arange(len(idx)), np.zeros(n - len(idx), np.int64)])
      args = (batch.prompt_BP[idx][pad], batch.prompt_mask_BP[idx][pad], tokens[idx][pad], keep[pad], idx[pad])
      if mesh is not None:
        args = sharding_lib.put(args, jax.tree.map(lambda x: sharding_lib.batch_sharding(mesh, x.ndim), args))
        key = sharding_lib.put(key, sharding_lib.replicated(mesh))
      data_axis = () if mesh is None else resolve_data_axis(mesh, None)
      out = sharding_lib.fetch(verify.resume(params, *args, key, model_cfg=model_cfg, cfg=cfg, mesh=mesh,
                                             data_axis=data_axis))
      t_new, m_new, f_new, l_new = (np.asarray(x)[:len(idx)] for x in out)
      tokens[idx], mask[idx], finish[idx], length[idx] = t_new, m_new, f_new, l_new
    tok = self.sampler.tokenizer
    responses = tuple(tok.decode(tokens[b]) if b in set(rows.tolist()) else r for b, r in enumerate(batch.responses))
    return dataclasses.replace(batch, tokens_BR=tokens, mask_BR=mask, context_BR=mask.copy(), length_B=length,
                               truncated_B=finish == FINISH_LENGTH, responses=responses)

  def metrics(self) -> dict[str, float]:
    return {**self.inner.metrics(), **self.counts}

  def close(self) -> None:
    self.inner.close()

