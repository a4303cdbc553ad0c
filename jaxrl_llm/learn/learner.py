"""The one optimizer step under every loss: `Learner(spec)` with `spec.loss_fn` injected.

The RL update (training/update.py), the warm start's SFT (training/sft.py), the
reward models' Bradley-Terry and process losses and DPO (reward_model/trainer.py)
are each a `LossFn` on it; this module owns what they share:

* **exact micro-batching.** `spec.norms_fn` computes the loss's normalisers on
  the whole mini-batch once; every micro-batch's `LossOut.objective` divides by
  them, so it is that micro-batch's exact share of the mini-batch loss, and the
  sum of the micro-batches' gradients is the full-batch gradient
  (objectives/aggregation.py). Micro-batches run in a `lax.scan` that sums the
  gradients, the loss's (numerator, denominator), `LossOut.sums` and combines
  `LossOut.extrema`.
* **per-row outputs** (`LossOut.rows`, the token-weight dump's factors) come
  from a forward-only program of their own (`step_rows`) at the step's starting
  params, in row order; the step is then `apply`'s own program. A program with
  more outputs may be rounded differently by XLA (XLA:CPU's elemental emitters
  moved 4 of 3,168 weights by 1 ulp), so asking for the rows never changes the
  run.
* **groups.** What trains is one or more named trees, each with its own
  optimizer and its own guard (the policy and PPO's value head); a group with
  `lora=True` trains a LoRA model's adapters only (model/lora.py), its frozen
  base an argument of its own that is not donated.
* **the guarded update** (learn/optim.py): a non-finite loss or gradient leaves
  the group's params and optimizer state as they were; NaN never reaches the
  weights.
* **shardings and donation**: `Learner` jits the step once with the state's,
  the batch's and the auxiliary inputs' shardings; the state is donated.
  `apply` runs it, `lower` lowers it for given arguments (the compile command
  and the TPU plan lower the very same program).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxrl_llm import faults
from jaxrl_llm.learn.optim import guarded_update
from jaxrl_llm.model import lora
from jaxrl_llm.objectives.aggregation import WeightedSum

POLICY = "policy"  # the conventional name of the group that holds the policy's params


@struct.dataclass
class LossOut:
  """What a loss function returns for one micro-batch."""

  objective: jax.Array  # [] what jax.grad differentiates: the micro-batch's exact share of the mini-batch loss
  loss: WeightedSum  # the loss as (numerator, denominator), summed over micro-batches; value: the reported loss
  sums: Any = None  # a pytree summed over micro-batches (metrics as WeightedSums, counts, pair stats)
  extrema: dict = struct.field(default_factory=dict)  # name -> []: min over micro-batches for *_min names, else max
  rows: dict = struct.field(default_factory=dict)  # name -> [b, ...]: per-row outputs, concatenated in row order


# loss_fn(trees, micro_batch, aux, norms) -> LossOut. trees: {group name: params (a LoRA group's
# adapters joined with its frozen base)}; aux: the step's inputs without a row axis; norms: norms_fn(batch).
LossFn = Callable[[dict, Any, Any, Any], LossOut]


@struct.dataclass
class Slot:
  """One group's trained tree and its optimizer state (what the step donates and replaces)."""

  params: Any  # the trained params: a LoRA group's adapters only (lora.partition)
  opt_state: Any  # the group's optax state of `params`


@struct.dataclass
class StepOut:
  """The step's results before `spec.report` formats them."""

  loss: WeightedSum  # summed over micro-batches
  sums: Any  # LossOut.sums, summed
  extrema: dict  # LossOut.extrema, combined
  grad_norm: dict  # group name -> [] global norm of the group's gradient
  skipped: dict  # group name -> [] 1.0 where the guard dropped the group's update


@dataclasses.dataclass(frozen=True)
class Group:
  """A named tree the step trains with its own optimizer."""

  name: str
  tx: optax.GradientTransformation
  lora: bool = False  # train a LoRA model's adapters only; the base is frozen (and not donated)
  update: bool = True  # False: the tree rides along unchanged (PPO's value head in a run without a critic)


@dataclasses.dataclass(frozen=True)
class LearnSpec:
  """Static description of the step (hashable: closed over by the jitted function)."""

  loss_fn: LossFn
  norms_fn: Callable[[Any], Any]  # batch -> the loss's normalisers on the whole mini-batch
  groups: tuple[Group, ...]
  n_micro: int = 1  # micro-batches per mini-batch (each leaf of the batch splits along its first axis)
  report: Callable[[StepOut], Any] = lambda out: out  # StepOut -> the step's metrics (inside the jitted step)
  grad_fault: str = ""  # a faults point that poisons the first group's gradients while it is planned

  def __post_init__(self):
    if self.n_micro < 1:
      raise ValueError(f"LearnSpec.n_micro={self.n_micro}: expected >= 1")
    if not self.groups:
      raise ValueError("LearnSpec.groups is empty: expected at least one trained group")


def split_micro(batch, n_micro: int):
  """Every leaf [B, ...] -> [n_micro, B / n_micro, ...] (rows in order)."""
  return jax.tree.map(lambda x: x.reshape((n_micro, x.shape[0] // n_micro) + x.shape[1:]), batch)


def _combine_extrema(a: dict, b: dict) -> dict:
  return {k: (jnp.minimum if k.endswith("_min") else jnp.maximum)(a[k], b[k]) for k in a}


def learn_step(slots: dict, frozen: dict, batch, aux, *, spec: LearnSpec):
  """One optimizer step on a mini-batch: -> (slots, spec.report(StepOut)).

  slots: {group name: Slot}; frozen: {group name: a LoRA group's frozen base, else None}.
  """
  trained = {n: s.params for n, s in slots.items()}
  norms = spec.norms_fn(batch)

  def objective(t, mb):
    out = spec.loss_fn({n: lora.join(t[n], frozen[n]) for n in t}, mb, aux, norms)
    return out.objective, out

  grad_fn = jax.grad(objective, has_aux=True)
  micro = split_micro(batch, spec.n_micro)

  def body(carry, mb):
    g_acc, acc = carry
    g, out = grad_fn(trained, mb)
    acc = (acc[0] + out.loss, jax.tree.map(jnp.add, acc[1], out.sums), _combine_extrema(acc[2], out.extrema))
    return (jax.tree.map(jnp.add, g_acc, g), acc), None

  # The first micro-batch runs outside the scan: it gives the sums' structure to accumulate into.
  g0, out0 = grad_fn(trained, jax.tree.map(lambda x: x[0], micro))
  carry = (jax.tree.map(jnp.add, jax.tree.map(jnp.zeros_like, trained), g0), (out0.loss, out0.sums, out0.extrema))
  if spec.n_micro > 1:
    carry, _ = jax.lax.scan(body, carry, jax.tree.map(lambda x: x[1:], micro))
  grads, (total, sums, extrema) = carry

  loss = total.value()
  first = spec.groups[0].name
  if spec.grad_fault and faults.traced(spec.grad_fault):  # the reliability matrix: non-finite gradients
    grads = {**grads, first: jax.tree.map(lambda g: g * jnp.nan, grads[first])}
  new, grad_norm, skipped = dict(slots), {}, {}
  for group in spec.groups:
    if not group.update:
      continue
    s = slots[group.name]
    params, opt_state, grad_norm[group.name], skipped[group.name] = guarded_update(
        group.tx, grads[group.name], s.opt_state, s.params, loss)
    new[group.name] = Slot(params=params, opt_state=opt_state)
  out = StepOut(loss=total, sums=sums, extrema=extrema, grad_norm=grad_norm, skipped=skipped)
  return new, spec.report(out)


def step_rows(slots: dict, frozen: dict, batch, aux, *, spec: LearnSpec) -> dict:
  """`LossOut.rows` of `learn_step`'s loss at `slots` on a mini-batch, {name: [B, ...]} in row order: the
  loss's forward pass alone, micro-batch by micro-batch, with the same normalisers."""
  trained = {n: s.params for n, s in slots.items()}
  norms = spec.norms_fn(batch)
  rows = jax.lax.map(lambda mb: spec.loss_fn({n: lora.join(trained[n], frozen[n]) for n in trained}, mb, aux,
                                             norms).rows, split_micro(batch, spec.n_micro))
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), rows)


@dataclasses.dataclass(frozen=True)
class Learner:
  """`learn_step` of `spec` compiled once for the state's, the batch's and aux's placement.

  `apply(slots, frozen, batch, aux)` donates `slots` (a LoRA group's frozen base is an argument
  of its own and is not donated: snapshots such as the KL reference share it).
  """

  spec: LearnSpec
  slot_shardings: dict  # {group name: Slot of shardings}
  frozen_shardings: dict  # {group name: shardings of the frozen base, or None}
  batch_sharding: Any  # a pytree prefix of the batch: its rows over data x fsdp
  aux_sharding: Any = None  # a pytree prefix of aux (None: keep the arguments' placement)
  report_sharding: Any = None  # the metrics' placement
  rows_sharding: Any = None  # the per-row outputs' (`apply_with_rows`)

  @property
  def _in_shardings(self):
    return (self.slot_shardings, self.frozen_shardings, self.batch_sharding, self.aux_sharding)

  @functools.cached_property
  def _apply(self):
    return jax.jit(functools.partial(learn_step, spec=self.spec), in_shardings=self._in_shardings,
                   out_shardings=(self.slot_shardings, self.report_sharding), donate_argnums=(0,))

  @functools.cached_property
  def _rows(self):
    return jax.jit(functools.partial(step_rows, spec=self.spec), in_shardings=self._in_shardings,
                   out_shardings=self.rows_sharding)

  def apply(self, slots: dict, frozen: dict, batch, aux):
    """-> (slots, metrics): one step on one mini-batch placed with `batch_sharding`."""
    return self._apply(slots, frozen, batch, aux)

  def apply_with_rows(self, slots: dict, frozen: dict, batch, aux):
    """-> (slots, metrics, rows): `apply`, and the loss's `LossOut.rows` ({name: [B, ...]}) at the step's
    starting params from the forward-only program (`step_rows`): the step is the same program as
    `apply`'s, so the run is the same bits with or without the rows."""
    rows = self._rows(slots, frozen, batch, aux)  # before `apply` donates `slots`
    new, report = self._apply(slots, frozen, batch, aux)
    return new, report, rows

  def lower(self, slots: dict, frozen: dict, batch, aux):
    """`apply`'s program lowered for these arguments (arrays or ShapeDtypeStructs with shardings)."""
    return self._apply.lower(slots, frozen, batch, aux)

  def compiled_count(self) -> int:
    """How many programs `apply` has compiled (1 for a run whose mini-batches share one shape)."""
    return self._apply._cache_size()  # pylint: disable=protected-access


def make_learner(spec: LearnSpec, slots: dict, frozen: dict, batch_sharding, *, aux_sharding=None,
                 report_sharding=None, rows_sharding=None) -> Learner:
  """The `Learner` of `spec` for a state placed like `slots` and `frozen` (their arrays' shardings)."""
  names = {g.name for g in spec.groups}
  if set(slots) != names:
    raise ValueError(f"make_learner: slots {sorted(slots)} must be the spec's groups {sorted(names)}")
  sh = lambda tree: jax.tree.map(lambda a: a.sharding, tree)  # noqa: E731
  return Learner(spec=spec, slot_shardings=sh(slots), frozen_shardings=sh(frozen), batch_sharding=batch_sharding,
                 aux_sharding=aux_sharding, report_sharding=report_sharding, rows_sharding=rows_sharding)


def snapshot(params):
  """A copy of what the update changes (the update donates it, a snapshot must outlive it): the
  params, or a LoRA model's adapters beside the same frozen base arrays (model/lora.py; the update
  never donates those), so a LoRA run's KL reference and staleness buffer hold no second base."""
  trainable, frozen = lora.partition(params)
  return lora.join(jax.tree.map(jnp.copy, trainable), frozen)
