"""One optimizer update on a mini-batch: micro-batched, exact, guarded.

The mini-batch's normalisers (`batch_norms`) are computed once and passed to
every micro-batch, so each micro-batch's loss numerator is its exact share of
the mini-batch loss and the summed gradient equals the full-batch gradient
under every aggregation mode (objectives/aggregation.py). Micro-batches run
in a `lax.scan` that accumulates gradients and metric (numerator,
denominator) pairs; the loss is sum(numerators) / sum(denominators).

Extra per-token loss terms (a teacher's, say) plug in through `extra_terms`:
callables `fn(ctx) -> WeightedSum` over a `LossContext`, added to the loss
with the same normalisers. Inputs without a batch axis (an output head, say)
come in `aux`, a dict of arrays shared by every micro-batch (`ctx.aux`).

The policy's sums over the vocabulary (log pi_theta, entropy, Score
Centering's C, TRM's KL) are `vocab_terms.vocab_terms`: streamed by the
kernels unless `kernels.impl = "naive"`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import faults
from jaxrl_llm import model as model_lib
from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.model import lora
from jaxrl_llm.model.heads import value_head
from jaxrl_llm.training.batch import AUX_BEHAV_HEAD, TrainBatch
from jaxrl_llm.model.logprobs import response_hidden
from jaxrl_llm.training.optim import guarded_update
from jaxrl_llm.training.vocab_terms import vocab_terms


@struct.dataclass
class LossContext:
  """What an extra loss term sees for one micro-batch."""

  params: dict  # the policy params (differentiable)
  hidden_BRD: jax.Array  # [B, R, D] final hidden states predicting each response token
  logp_BR: jax.Array  # [B, R] log pi_theta of the sampled tokens (differentiable)
  batch: TrainBatch  # the micro-batch (extra_BR holds the extra per-token inputs)
  norms: obj_lib.BatchNorms  # normalisers of the whole mini-batch
  aux: dict  # name -> array: the update's non-row inputs (e.g. an output head), no gradient


ExtraTerm = Callable[[LossContext], obj_lib.WeightedSum]


@struct.dataclass
class UpdateState:
  """What one optimizer update reads and replaces (the jitted update donates it)."""

  params: dict  # the policy params (model pytree)
  opt_state: tuple  # optax state of `lora.trainable(params)`: the whole model, or a LoRA model's adapters
  value_params: dict  # the value head (PPO; trained only when UpdateSpec.use_value)
  value_opt_state: tuple  # optax state of `value_params`


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
  """Static description of the update (hashable: a jit static argument)."""

  model_cfg: model_lib.ModelConfig
  objective: obj_lib.ObjectiveConfig
  group_size: int
  n_micro: int  # micro-batches per mini-batch
  temperature: float  # the sampling temperature: pi_theta is evaluated at it, like mu
  impl: str  # kernels.impl
  use_value: bool  # PPO: train the value head
  prompt_group: int = 1  # G: rows in groups of G sharing a prompt, run once (model/logprobs.response_hidden); 1: no sharing
  always_share: bool = False  # share the prompt even where it costs more FLOPs (train.share_prompt=on)
  prox_source: str = "recompute"  # log pi_prox: the batch's recompute | detach (this pass's, gradient stopped) | behaviour (mu); training/prox.py
  extra_terms: tuple[tuple[str, ExtraTerm], ...] = ()


def _micro_loss(params, vparams, mb: TrainBatch, aux: dict, norms, spec: UpdateSpec):
  obj = spec.objective
  # The model reads every response token (an episode's observations too); the loss weighs mask_BR's.
  hidden_BRD = response_hidden(params, spec.model_cfg, mb.prompt_BP, mb.prompt_mask_BP, mb.tokens_BR,
                               mb.attend_BR, prompt_group=spec.prompt_group, always_share=spec.always_share,
                               packing=mb.packing)
  if faults.traced("logits_nan"):  # the reliability matrix: non-finite logits in every update
    hidden_BRD = hidden_BRD * jnp.nan
  vt = vocab_terms(
      hidden_BRD, model_lib.lm_head(params, spec.model_cfg), mb.tokens_BR, mb.mask_BR, obj,
      temperature=spec.temperature, impl=spec.impl,
      topk_ids_BRK=mb.topk_ids_BRK if obj.needs_centering else None,
      topk_logp_BRK=mb.topk_logp_BRK if obj.needs_centering else None,
      behav_hidden_BRD=mb.behav_hidden_BRD if obj.needs_token_kl else None,
      behav_head_DV=aux[AUX_BEHAV_HEAD] if obj.needs_token_kl else None)
  logp_BR, entropy_BR = vt.logp_BR, vt.entropy_BR
  prox_BR = {"recompute": mb.prox_logp_BR, "detach": jax.lax.stop_gradient(logp_BR),
             "behaviour": mb.behav_logp_BR}[spec.prox_source]
  pl = obj_lib.policy_loss(
      logp_BR, prox_BR, mb.behav_logp_BR, mb.adv_BR, mb.mask_BR, obj,
      norms=norms, centering=vt.centering_BR, kl_BR=vt.kl_BR,
      ref_logp_BR=mb.ref_logp_BR if obj.needs_ref and obj.kl_placement == "loss" else None,
      entropy_BR=entropy_BR if obj.needs_entropy else None)
  num = pl.loss.numerator
  metrics = dict(pl.metrics)
  metrics["loss/policy"] = pl.loss
  metrics["entropy/mean"] = obj_lib.masked_mean(jax.lax.stop_gradient(entropy_BR), mb.mask_BR)
  extrema = dict(pl.extrema)
  if vt.kl_BR is not None:
    # TRM's full-vocabulary KL(mu || pi_theta), the quantity its sequence masks threshold.
    metrics["kl/behav_theta"] = obj_lib.masked_mean(vt.kl_BR, mb.mask_BR)
    extrema["kl/behav_theta_max"] = jnp.max(jnp.where(mb.mask_BR, vt.kl_BR, -jnp.inf))
  if spec.use_value:
    values_BR = value_head(vparams, hidden_BRD)
    vl = obj_lib.value_loss(values_BR, mb.old_values_BR, mb.returns_BR, mb.mask_BR, clip=obj.value_clip,
                            aggregation=obj.aggregation, norms=norms)
    num = num + obj.value_coef * vl.numerator
    metrics["loss/value"] = vl
  ctx = LossContext(params=params, hidden_BRD=hidden_BRD, logp_BR=logp_BR, batch=mb, norms=norms, aux=aux)
  for name, term in spec.extra_terms:
    ws = term(ctx)
    num = num + ws.numerator
    metrics[f"loss/{name}"] = ws
  total = obj_lib.WeightedSum(num, pl.loss.denominator)
  return num, (total, metrics, extrema, pl.counts, pl.tokens.arrays())


def _split_micro(batch: TrainBatch, n_micro: int) -> TrainBatch:
  return jax.tree.map(lambda x: x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:]), batch)


def _combine_extrema(a: dict, b: dict) -> dict:
  return {k: (jnp.minimum if k.endswith("_min") else jnp.maximum)(a[k], b[k]) for k in a}


def _update(state: UpdateState, batch: TrainBatch, aux: dict, *, spec: UpdateSpec, tx, vtx):
  """The update and the loss's per-token factors ({name: [mini, R]}, rows in batch order)."""
  opt_state, vparams, vopt_state = state.opt_state, state.value_params, state.value_opt_state
  # What trains: the whole model, or a LoRA model's adapters (model/lora.py), the frozen base a constant here.
  params, frozen = lora.partition(state.params)
  norms = obj_lib.batch_norms(batch.mask_BR, spec.group_size if spec.objective.aggregation ==
                              "group_token_mean" else 1, spec.objective)
  grad_fn = jax.grad(lambda p, *args: _micro_loss(lora.join(p, frozen), *args), argnums=(0, 1), has_aux=True)
  micro = _split_micro(batch, spec.n_micro)

  def body(carry, mb):
    g_acc, out_acc = carry
    (g, vg), out = grad_fn(params, vparams, mb, aux, norms, spec)
    g_acc = jax.tree.map(jnp.add, g_acc, (g, vg))
    total, metrics, extrema, counts, tokens = out
    a_total, a_metrics, a_extrema, a_counts = out_acc
    out_acc = (a_total + total, jax.tree.map(jnp.add, a_metrics, metrics), _combine_extrema(a_extrema, extrema),
               jax.tree.map(jnp.add, a_counts, counts))
    return (g_acc, out_acc), tokens

  zeros = jax.tree.map(jnp.zeros_like, (params, vparams))
  # First micro-batch outside the scan gives the metrics' structure to accumulate into.
  first = jax.tree.map(lambda x: x[0], micro)
  (g0, vg0), out0 = grad_fn(params, vparams, first, aux, norms, spec)
  tokens = out0[-1]
  carry = (jax.tree.map(jnp.add, zeros, (g0, vg0)), out0[:-1])
  if spec.n_micro > 1:
    rest = jax.tree.map(lambda x: x[1:], micro)
    carry, rest_tokens = jax.lax.scan(body, carry, rest)
    tokens = jax.tree.map(lambda a, b: jnp.concatenate([a, b.reshape((-1,) + b.shape[2:])]), tokens, rest_tokens)
  (grads, vgrads), (total, metrics, extrema, counts) = carry

  loss = total.value()
  if faults.traced("grad_nan"):  # the reliability matrix: non-finite gradients in every update
    grads = jax.tree.map(lambda g: g * jnp.nan, grads)
  params, opt_state, grad_norm, skipped = guarded_update(tx, grads, opt_state, params, loss)
  if spec.use_value:
    vparams, vopt_state, vgrad_norm, vskipped = guarded_update(vtx, vgrads, vopt_state, vparams, loss)
  out = {k: v.value() for k, v in metrics.items()}
  out.update(extrema)
  out.update({f"count/{k}": v for k, v in counts.items()})
  out["loss/total"] = loss
  out["grad/norm"] = grad_norm
  out["update/skipped_nonfinite"] = skipped
  if spec.use_value:
    out["grad/value_norm"] = vgrad_norm
  new = UpdateState(params=lora.join(params, frozen), opt_state=opt_state, value_params=vparams,
                    value_opt_state=vopt_state)
  return new, out, tokens


def update_step(state: UpdateState, batch: TrainBatch, aux: dict, *, spec: UpdateSpec, tx, vtx
                ) -> tuple[UpdateState, dict]:
  """One optimizer update on a mini-batch: -> (the new state, metrics).

  aux: name -> array, inputs without a batch axis, the same for every
  micro-batch (`LossContext.aux`); AUX_BEHAV_HEAD for TRM.
  """
  new, metrics, _ = _update(state, batch, aux, spec=spec, tx=tx, vtx=vtx)
  return new, metrics


def update_step_with_factors(state: UpdateState, batch: TrainBatch, aux: dict, *, spec: UpdateSpec, tx, vtx
                             ) -> tuple[UpdateState, dict, dict]:
  """`update_step` that also returns the policy loss's per-token factors:
  -> (state, metrics, factors), factors = `TokenFactors.arrays()` of every
  micro-batch, {name: [mini-batch rows, R]} in the mini-batch's row order. The
  same update: the token-weight dump's steps run it (training/dump.py)."""
  return _update(state, batch, aux, spec=spec, tx=tx, vtx=vtx)


@dataclasses.dataclass(frozen=True)
class Updater:
  """A run's update, compiled once here: `apply` is `update_step` under `jax.jit` with the state's
  shardings, `apply_with_factors` the token-weight dump's variant (compiled at its first call)."""

  spec: UpdateSpec
  tx: Any  # optax transformation of the policy params
  vtx: Any  # optax transformation of the value head
  state_shardings: UpdateState  # the sharding of every leaf of the state (in and out), params: lora.trainable's
  frozen_shardings: dict | None  # a LoRA model's frozen base's (lora.partition), else None
  batch_sharding: jax.sharding.NamedSharding  # the mini-batch's rows over data x fsdp
  replicated: jax.sharding.NamedSharding  # metrics

  # A LoRA model's frozen base is an argument of its own, not donated: snapshots (the staleness
  # buffer, the KL reference) share it with the state (training/context.snapshot), and a donated
  # buffer is gone after the call. The rest of the state is donated: the update replaces it.
  def _jit(self, fn, extra_out=()):
    def run(state, frozen, batch, aux):
      out = fn(state.replace(params=lora.join(state.params, frozen)), batch, aux, spec=self.spec, tx=self.tx,
               vtx=self.vtx)
      return (out[0].replace(params=lora.partition(out[0].params)[0]),) + tuple(out[1:])
    return jax.jit(run, in_shardings=(self.state_shardings, self.frozen_shardings, self.batch_sharding, None),
                   out_shardings=(self.state_shardings, self.replicated) + extra_out, donate_argnums=(0,))

  @functools.cached_property
  def _apply(self):
    # `aux` (step.update_aux) is not donated (the step's updates share it) and keeps the placement
    # update_aux gave it (None).
    return self._jit(update_step)

  @functools.cached_property
  def _apply_with_factors(self):
    # The per-token factors keep the mini-batch's row axis, sharded like the batch.
    return self._jit(update_step_with_factors, (self.batch_sharding,))

  def _call(self, fn, state: UpdateState, batch: TrainBatch, aux: dict):
    trainable, frozen = lora.partition(state.params)
    out = fn(state.replace(params=trainable), frozen, batch, aux)
    return (out[0].replace(params=lora.join(out[0].params, frozen)),) + tuple(out[1:])

  def apply(self, state: UpdateState, batch: TrainBatch, aux: dict) -> tuple[UpdateState, dict]:
    """`update_step` on one mini-batch (placed with `batch_sharding`); donates `state` (but a
    LoRA model's frozen base)."""
    return self._call(self._apply, state, batch, aux)

  def apply_with_factors(self, state: UpdateState, batch: TrainBatch, aux: dict) -> tuple[UpdateState, dict, dict]:
    """`update_step_with_factors` on one mini-batch; donates `state` (but a LoRA model's frozen base)."""
    return self._call(self._apply_with_factors, state, batch, aux)

  def lower(self, state: UpdateState, batch: TrainBatch, aux: dict):
    """`apply`'s program lowered for these arguments (their shapes and shardings): `.compile()` gives
    its HLO, memory and cost analyses."""
    trainable, frozen = lora.partition(state.params)
    return self._apply.lower(state.replace(params=trainable), frozen, batch, aux)

  def compiled_count(self) -> int:
    """How many programs `apply` has compiled (1 for a run whose mini-batches share one shape)."""
    return self._apply._cache_size()  # pylint: disable=protected-access


def make_updater(spec: UpdateSpec, tx, vtx, state: UpdateState, batch_sharding, replicated) -> Updater:
  """The `Updater` of `spec` for a state placed like `state` (its arrays' shardings)."""
  trainable, frozen = lora.partition(state.params)
  shardings = jax.tree.map(lambda a: a.sharding, state.replace(params=trainable))
  return Updater(spec=spec, tx=tx, vtx=vtx, state_shardings=shardings,
                 frozen_shardings=jax.tree.map(lambda a: a.sharding, frozen), batch_sharding=batch_sharding,
                 replicated=replicated)
