"""The RL update: the policy loss of one micro-batch as a loss of the learner (learn/learner.py).

`rl_loss` is the master equation's loss (objectives/), PPO's value loss and
the extensions' terms on one micro-batch; the learner runs it micro-batched
and exact, guarded and donated. The mini-batch's normalisers (`rl_norms`,
objectives' `batch_norms`) are computed once and passed to every
micro-batch, so each micro-batch's loss numerator is its exact share of the
mini-batch loss and the summed gradient equals the full-batch gradient
under every aggregation mode (objectives/aggregation.py); the loss is
sum(numerators) / sum(denominators).

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

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_llm import faults
from jaxrl_llm import model as model_lib
from jaxrl_llm.learn.learner import (POLICY, Group, LearnSpec, Learner, LossOut, Slot, StepOut, learn_step,
                                     make_learner)
from jaxrl_llm import objectives as obj_lib
from jaxrl_llm.model import lora
from jaxrl_llm.model.heads import value_head
from jaxrl_llm.training.batch import AUX_BEHAV_HEAD, TrainBatch
from jaxrl_llm.model.logprobs import response_hidden
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

VALUE = "value"  # the learner's group of PPO's value head (the policy's: learn.learner.POLICY)


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

  @classmethod
  def from_run(cls, cfg, model_cfg: model_lib.ModelConfig, extra_terms: tuple = ()) -> "UpdateSpec":
    """The update of the run config `cfg` (after `with_micro_batch`) with the extensions' loss terms:
    what the trainer compiles (Trainer.make_updater) and the compile command lowers (tpu/programs.py)."""
    return cls(model_cfg=model_cfg, objective=cfg.objective, group_size=cfg.rollout.group_size,
               n_micro=cfg.mini_batch_size // cfg.micro_batch_size, temperature=cfg.rollout.temperature,
               impl=cfg.kernels.impl, use_value=cfg.use_value, extra_terms=tuple(extra_terms),
               prox_source=cfg.prox.source, prompt_group=cfg.prompt_group,
               always_share=cfg.always_share)


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


def rl_loss(trees: dict, mb: TrainBatch, aux: dict, norms, *, spec: UpdateSpec) -> LossOut:
  """The RL update's loss on one micro-batch, a `LossFn` of the learner (learn/learner.py): the
  policy loss, PPO's value loss and the extensions' terms; rows: the policy loss's per-token factors."""
  num, (total, metrics, extrema, counts, tokens) = _micro_loss(trees[POLICY], trees[VALUE], mb, aux, norms, spec)
  return LossOut(objective=num, loss=total, sums=(metrics, counts), extrema=extrema, rows=tokens)


def rl_norms(batch: TrainBatch, *, spec: UpdateSpec) -> obj_lib.BatchNorms:
  """The mini-batch's normalisers (objectives/aggregation.py), passed to every micro-batch."""
  group = spec.group_size if spec.objective.aggregation == "group_token_mean" else 1
  return obj_lib.batch_norms(batch.mask_BR, group, spec.objective)


def rl_report(out: StepOut, *, spec: UpdateSpec) -> dict:
  """The update's metrics: the loss's terms, extrema and counts, the total loss and the gradient norms."""
  metrics, counts = out.sums
  report = {k: v.value() for k, v in metrics.items()}
  report.update(out.extrema)
  report.update({f"count/{k}": v for k, v in counts.items()})
  report["loss/total"] = out.loss.value()
  report["grad/norm"] = out.grad_norm[POLICY]
  report["update/skipped_nonfinite"] = out.skipped[POLICY]
  if spec.use_value:
    report["grad/value_norm"] = out.grad_norm[VALUE]
  return report


def learn_spec(spec: UpdateSpec, tx, vtx) -> LearnSpec:
  """The RL update as the learner's step: the policy (a LoRA model's adapters) and the value head."""
  return LearnSpec(loss_fn=functools.partial(rl_loss, spec=spec), norms_fn=functools.partial(rl_norms, spec=spec),
                   groups=(Group(POLICY, tx, lora=True), Group(VALUE, vtx, update=spec.use_value)),
                   n_micro=spec.n_micro, report=functools.partial(rl_report, spec=spec), grad_fault="grad_nan")


def _slots(state: UpdateState) -> tuple[dict, dict]:
  trainable, frozen = lora.partition(state.params)
  return ({POLICY: Slot(trainable, state.opt_state), VALUE: Slot(state.value_params, state.value_opt_state)},
          {POLICY: frozen, VALUE: None})


def _state(slots: dict, frozen: dict) -> UpdateState:
  return UpdateState(params=lora.join(slots[POLICY].params, frozen[POLICY]), opt_state=slots[POLICY].opt_state,
                     value_params=slots[VALUE].params, value_opt_state=slots[VALUE].opt_state)


def update_step(state: UpdateState, batch: TrainBatch, aux: dict, *, spec: UpdateSpec, tx, vtx
                ) -> tuple[UpdateState, dict]:
  """One optimizer update on a mini-batch: -> (the new state, metrics) (unjitted; `Updater.apply` jits it).

  aux: name -> array, inputs without a batch axis, the same for every
  micro-batch (`LossContext.aux`); AUX_BEHAV_HEAD for TRM.
  """
  slots, frozen = _slots(state)
  new, metrics = learn_step(slots, frozen, batch, aux, spec=learn_spec(spec, tx, vtx))
  return _state(new, frozen), metrics


@dataclasses.dataclass(frozen=True)
class Updater:
  """A run's update: the learner's step (learn/learner.py) with the RL loss, compiled once for the
  state's shardings; `apply_with_factors` the token-weight dump's variant, which also returns the
  policy loss's per-token factors (`TokenFactors.arrays()`, {name: [mini-batch rows, R]} in row order)."""

  spec: UpdateSpec
  learner: Learner

  def apply(self, state: UpdateState, batch: TrainBatch, aux: dict) -> tuple[UpdateState, dict]:
    """One update on one mini-batch (placed with the learner's batch sharding); donates `state` (but a
    LoRA model's frozen base). aux (step.update_aux) is not donated: the step's updates share it."""
    slots, frozen = _slots(state)
    new, metrics = self.learner.apply(slots, frozen, batch, aux)
    return _state(new, frozen), metrics

  def apply_with_factors(self, state: UpdateState, batch: TrainBatch, aux: dict) -> tuple[UpdateState, dict, dict]:
    """`apply`, and the per-token factors at `state` from a forward-only program (the update is `apply`'s
    own program, so the run is the same bits); donates `state` (but a LoRA model's frozen base)."""
    slots, frozen = _slots(state)
    new, metrics, factors = self.learner.apply_with_rows(slots, frozen, batch, aux)
    return _state(new, frozen), metrics, factors

  def lower(self, state: UpdateState, batch: TrainBatch, aux: dict):
    """`apply`'s program lowered for these arguments (their shapes and shardings): `.compile()` gives
    its HLO, memory and cost analyses."""
    return self.learner.lower(*_slots(state), batch, aux)

  def compiled_count(self) -> int:
    """How many programs `apply` has compiled (1 for a run whose mini-batches share one shape)."""
    return self.learner.compiled_count()


def make_updater(spec: UpdateSpec, tx, vtx, state: UpdateState, batch_sharding, replicated) -> Updater:
  """The `Updater` of `spec` for a state placed like `state` (its arrays' shardings)."""
  slots, frozen = _slots(state)
  # The per-token factors keep the mini-batch's row axis, sharded like the batch; aux keeps the
  # placement update_aux gave it.
  learner = make_learner(learn_spec(spec, tx, vtx), slots, frozen, batch_sharding, report_sharding=replicated,
                         rows_sharding=batch_sharding)
  return Updater(spec=spec, learner=learner)
