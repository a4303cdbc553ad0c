"""Recompute stage: log pi_prox (the params as this batch's updates begin),
log pi_ref (the frozen warm-started model), the value head's predictions and
the sampler's final hidden states (TRM), without gradient, in chunks of the
micro-batch size."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import model as model_lib
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.heads import value_head
from jaxrl_llm.model.invariant import rowwise_logprobs, rowwise_values
from jaxrl_llm.model.logprobs import response_hidden, response_logprobs
from jaxrl_llm.sampling.engine import sampler_view
from jaxrl_llm.sampling.mismatch import NO_MISMATCH, SamplerMismatch, mismatched_params
from jaxrl_llm.training.batch import AUX_BEHAV_HEAD
from jaxrl_llm.training.pack import PackPolicy


@functools.partial(jax.jit, static_argnames=("model_cfg", "temperature", "impl", "with_values", "prompt_group",
                                                 "always_share"))
def _chunk(params, vparams, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, mask_BR, packing, *, model_cfg,
           temperature, impl, with_values, prompt_group=1, always_share=False):
  # The forward reads every response token (context_BR: an episode's observations too); log-probs and
  # values are kept on the sampled tokens (mask_BR) only.
  lp = response_logprobs(params, model_cfg, prompt_BP, prompt_mask_BP, tokens_BR, context_BR,
                         temperature=temperature, impl=impl, prompt_group=prompt_group,
                         always_share=always_share, packing=packing)
  logp_BR = jnp.where(mask_BR, lp.logp_BR, 0.0)
  values_BR = value_head(vparams, lp.hidden_BRD) if with_values else jnp.zeros_like(logp_BR)
  return logp_BR, jnp.where(mask_BR, values_BR, 0.0)


@dataclasses.dataclass(frozen=True)
class RecomputeSpec:
  """How the recompute stage runs a model over a batch's rows: at the sampling temperature, with the
  run's vocabulary kernels, `chunk` rows at a time, each chunk placed with `sharding` (None: as given)."""

  model_cfg: model_lib.ModelConfig
  temperature: float
  impl: str  # kernels.impl
  chunk: int  # rows per forward pass (the micro-batch size)
  sharding: jax.sharding.NamedSharding | None = None  # the rows' sharding over the mesh
  prompt_group: int = 1  # G: rows in groups of G sharing a prompt, run once (model/logprobs.response_hidden)
  always_share: bool = False  # share the prompt even where it costs more FLOPs (train.share_prompt=on)
  pack: PackPolicy | None = None  # train.pack: each chunk packed where it says (training/pack.py); None: padded
  # rollout.exact: each row alone in its padded layout (model/invariant.py), so a row's numbers do not
  # depend on the chunk, its position, the batch's other rows or the data axis; pack and prompt_group unused
  rowwise: bool = False

  @property
  def shards(self) -> int:
    """The batch shards the rows are split over (1 without a sharding)."""
    return 1 if self.sharding is None else sharding_lib.batch_shards(self.sharding.mesh)

  @classmethod
  def from_run(cls, cfg, model_cfg, *, sharding=None, pack: PackPolicy | None = None) -> "RecomputeSpec":
    """The recompute of the run config `cfg` (after `with_micro_batch`): what the step runs and the
    compile command lowers."""
    return cls(model_cfg=model_cfg, temperature=cfg.rollout.temperature, impl=cfg.kernels.impl,
               chunk=cfg.micro_batch_size, sharding=sharding, prompt_group=cfg.prompt_group,
               always_share=cfg.always_share, pack=pack, rowwise=cfg.rollout.exact)

  def run_chunk(self, params, vparams, args, *, with_values: bool):
    """The jitted forward of one chunk: args = (prompt_BP, prompt_mask_BP, tokens_BR, context_BR, mask_BR,
    packing) -> (logp_BR, values_BR)."""
    return _chunk(params, vparams, *args, **self._static(with_values))

  def lower_chunk(self, params, vparams, args, *, with_values: bool):
    """The program of one chunk lowered for these arguments (arrays or ShapeDtypeStructs with shardings):
    `run_chunk`'s, or with `rowwise` model/invariant.py's (log-probs and hidden states; the values are
    a second, small program over those)."""
    if self.rowwise:
      return rowwise_logprobs.lower(params, *args[:5], model_cfg=self.model_cfg, temperature=self.temperature,
                                    impl=self.impl, shards=self.shards)
    return _chunk.lower(params, vparams, *args, **self._static(with_values))

  def _static(self, with_values: bool) -> dict:
    return dict(model_cfg=self.model_cfg, temperature=self.temperature, impl=self.impl, with_values=with_values,
                prompt_group=self.prompt_group, always_share=self.always_share)


def _row_chunks(rows, chunk: int, sharding, pack: PackPolicy | None = None):
  """(prompt_BP, prompt_mask_BP, tokens_BR, context_BR, mask_BR, packing) of `rows` (a RolloutBatch or
  anything with those fields; context_BR, the tokens the forward reads, is mask_BR where it has none),
  `chunk` rows at a time, placed with `sharding`; packing: the chunk's model/packing.Packing where
  `pack` packs it, else None."""
  context_BR = getattr(rows, "context_BR", None)
  arrays = (rows.prompt_BP, rows.prompt_mask_BP, rows.tokens_BR,
            rows.mask_BR if context_BR is None else context_BR, rows.mask_BR)
  for s in range(0, rows.tokens_BR.shape[0], chunk):
    args = tuple(a[s:s + chunk] for a in arrays)
    packing = None if pack is None else pack.plan(args[1], args[3])
    args = args + (packing,)
    yield sharding_lib.put(args, sharding) if sharding is not None else args


def policy_logprobs(params, rows, spec: RecomputeSpec, *, vparams=None, with_values: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
  """-> (logp_BR, values_BR) of `rows`' response tokens under `params` as host f32 arrays (values from
  the value head `vparams`, zero unless with_values)."""
  if spec.rowwise:
    return _rowwise_logprobs(params, rows, spec, vparams=vparams, with_values=with_values)
  outs = [sharding_lib.fetch(spec.run_chunk(params, vparams, args, with_values=with_values))
          for args in _row_chunks(rows, spec.chunk, spec.sharding, spec.pack)]
  return (np.concatenate([o[0] for o in outs]).astype(np.float32),
          np.concatenate([o[1] for o in outs]).astype(np.float32))


def _rowwise_logprobs(params, rows, spec: RecomputeSpec, *, vparams, with_values: bool):
  """policy_logprobs with spec.rowwise: model/invariant.py's programs, `spec.chunk` rows at a time."""
  outs = []
  for args in _row_chunks(rows, spec.chunk, spec.sharding):
    logp_BR, hidden_BRD = rowwise_logprobs(params, *args[:5], model_cfg=spec.model_cfg, temperature=spec.temperature,
                                           impl=spec.impl, shards=spec.shards)
    values_BR = (rowwise_values(vparams, hidden_BRD, args[4], shards=spec.shards) if with_values
                 else jnp.zeros_like(logp_BR))
    outs.append(sharding_lib.fetch((logp_BR, values_BR)))
  return (np.concatenate([o[0] for o in outs]).astype(np.float32),
          np.concatenate([o[1] for o in outs]).astype(np.float32))


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def _hidden_chunk(params, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, mask_BR, packing, *, model_cfg):
  del mask_BR  # the hidden states of every response token; the update reads the sampled ones
  return response_hidden(params, model_cfg, prompt_BP, prompt_mask_BP, tokens_BR, context_BR, packing=packing)


def behaviour_hidden(sampler_params, sampling_cfg, rows, spec: RecomputeSpec,
                     mismatch: SamplerMismatch = NO_MISMATCH) -> jax.Array:
  """h_mu: the sampler's final hidden states [B, R, D] of `rows`, recomputed with its
  params and dtype. With its output head (`behaviour_head`) they give
  mu(v | prefix) = softmax(h_mu @ w_mu / T) at the sampling temperature: TRM's
  per-token KL(mu || pi_theta) in the update, without a [B, R, V] array. Exact
  when the sampler does not truncate (top_k = 0, top_p = 1), with the built-in
  engine's weight `mismatch` applied as the engine applies it. A device array:
  nothing on the host reads it."""
  params, run_cfg = sampler_view(sampler_params, spec.model_cfg, sampling_cfg, mismatch)
  outs = [_hidden_chunk(params, *args, model_cfg=run_cfg) for args in _row_chunks(rows, spec.chunk, spec.sharding, spec.pack)]
  return jnp.concatenate(outs)  # stays on the device: only the update reads it


def behaviour_head(model_cfg, sampling_cfg, state, mismatch: SamplerMismatch = NO_MISMATCH) -> dict:
  """The update's aux for TRM: {AUX_BEHAV_HEAD: the sampler's output head w_DV
  in the sampler's dtype, with its weight `mismatch`}."""
  params = state.sampler_params()
  w_DV = model_lib.lm_head(mismatched_params(params, mismatch) if mismatch.active else params, model_cfg)
  # Always a copy: without staleness the sampler's head is the policy's own
  # buffer, which the update donates, and mu must stay the sampling-time head
  # through all of the step's updates.
  dtype = sampling_cfg.dtype or w_DV.dtype
  return {AUX_BEHAV_HEAD: jnp.array(w_DV, dtype=dtype, copy=True)}
