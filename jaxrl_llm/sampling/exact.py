"""`rollout.exact`: log mu recorded by the trainer's own program, so log mu == log pi_prox bit for bit
on-policy (issue 43, item 2).

The built-in sampler draws each token from a KV-cache decode step: a [B, 1] query over the cache,
matmuls of other shapes and attention sums over other lengths than the trainer's full-sequence
forward, so the log-prob it records differs from the trainer's log pi_prox of the same token in
the last bits (the default run: mismatch/log_c_abs_mean about 2e-7 in f32). With `rollout.exact`
the engine still samples the tokens with the KV cache (their distribution is unchanged), then
records log mu of the finished rows with `model/invariant.rowwise_logprobs`, the batch-invariant
program the trainer's recompute runs under the same setting (training/recompute.py,
RecomputeSpec.rowwise): same rows, params, dtype, temperature and vocabulary kernels, each row
alone, so neither the chunk, the rows' order, the continuous slots that sampled them nor an
episode's turns change a bit. On-policy (staleness 0, no dtype or weight mismatch) log c =
log pi_prox - log mu is then exactly 0.

What log mu means there: the full-sequence policy's probability of the sampled token, which the
KV-cache decode that drew it computes to rounding (|log delta| ~ 1e-7 in f32). With a deliberate
mismatch (sampler_dtype, staleness, rollout.mismatch) log mu is the mismatched policy's,
recomputed the same way, and c carries that mismatch only. Truncated sampling (top_k, top_p) and
recorded top-k log-probs are refused by the config (the recompute is of the untruncated softmax).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.invariant import rowwise_logprobs
from jaxrl_llm.sampling.engine import RolloutBatch
from jaxrl_llm.sampling.generate import sampler_model_config
from jaxrl_llm.sampling.loop import cast_params


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

  @property
  def version(self) -> int:
    return self.inner.version

  def sync(self, params, version: int) -> None:
    self.inner.sync(params, version)

  def metrics(self) -> dict[str, float]:
    return self.inner.metrics()

  def generate(self, prompts, key) -> RolloutBatch:
    batch = self.inner.generate(prompts, key)
    s = self.sampler
    chunk = exact_chunk(batch.tokens_BR.shape[0], self.chunk)
    # The trainer runs its steps with the mesh in context (the vocabulary ops read it); so does this
    # recompute, also from the background thread of rollout.overlap.
    mesh = s.batch_sharding.mesh if s.batch_sharding is not None else None
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh) if mesh is not None else contextlib.nullcontext():
      behav_BR = exact_logprobs(s.params, s.model_cfg, s.sampling_cfg, batch, impl=self.impl, chunk=chunk,
                                batch_sharding=s.batch_sharding)
    return dataclasses.replace(batch, behav_logp_BR=behav_BR)

  def close(self) -> None:
    self.inner.close()

