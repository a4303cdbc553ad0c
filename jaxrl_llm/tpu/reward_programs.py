"""The programs of a reward-model run (`python -m jaxrl_llm.reward_model`: Bradley-Terry, process, DPO)
as shapes over a topology's devices: what `jaxrl_llm.compile --config=configs/reward_model.py` compiles.

Both are built by `reward_model.trainer.reward_steps`, the function the run itself calls
(tests/training/test_program_identity.py finds the same StableHLO both ways):

| program | function | calls per step |
|---|---|---|
| reward/train | the learner's optimizer step (learn/learner.py) on train.batch_size rows in micro-batches | 1 |
| reward/eval | the held-out step on train.batch_size rows | none (every eval.every steps) |

A row is a pair (chosen and rejected, T tokens each) or a process reward model's solution (T tokens);
T is the run's: data.max_len, or the longest encoded row of its data.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.learn.learner import Slot, snapshot
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.model.heads import init_reward_head
from jaxrl_llm.reward_model.scorer import HEAD_KEY, head_shardings
from jaxrl_llm.reward_model.trainer import MODEL, batch_arrays, micro_batch_size, reward_optimizer, reward_steps
from jaxrl_llm.tpu.forecast import model_flops
from jaxrl_llm.tpu.programs import Program, opt_sds, sds, with_shardings


@dataclasses.dataclass(frozen=True)
class RewardShapes:
  """A reward-model run's config and model shapes on a mesh."""

  cfg: Any  # reward_model.config.RewardModelConfig
  model_cfg: Any
  mesh: jax.sharding.Mesh
  tx: Any  # the run's AdamW
  arrays: tuple  # one row's arrays of the run's data (reward_model/trainer.py batch_arrays): dtypes, trailing shapes

  @property
  def rows(self) -> int:
    return self.cfg.train.batch_size

  @property
  def micro_batch_size(self) -> int:
    return micro_batch_size(self.cfg)

  @property
  def n_micro(self) -> int:
    return self.rows // self.micro_batch_size

  @property
  def seq_len(self) -> int:
    return self.arrays[0].shape[-1]

  @property
  def seqs_per_row(self) -> int:
    """Sequences per row: a pair's 2, a solution's 1."""
    return 1 if self.cfg.process else 2

  @property
  def param_copies(self) -> int:
    """Copies of the trained params held beside the programs: none counted. DPO's pi_ref is an argument
    of both programs (the learner's aux, the held-out step's ref), so their own memory holds it."""
    return 0

  @property
  def step_tokens(self) -> tuple[int, str]:
    return self.rows * self.seqs_per_row * self.seq_len, "trained"


def reward_shapes(cfg, model_cfg, mesh, data) -> RewardShapes:
  """The run of `cfg` on `mesh` with `data` (reward_model/trainer.py reward_data: its T and dtypes)."""
  return RewardShapes(cfg=cfg, model_cfg=model_cfg, mesh=mesh, tx=reward_optimizer(cfg)[1],
                      arrays=tuple(a[:1] for a in batch_arrays(data.train)))


def _in_mesh(fn):
  @functools.wraps(fn)
  def lower(shapes: RewardShapes, *args):
    with jax.sharding.use_abstract_mesh(shapes.mesh.abstract_mesh):
      return fn(shapes, *args)
  return lower


def batch_sds(shapes: RewardShapes, rows: int):
  """(one batch's arrays, weight_B) as shapes, rows over data x fsdp: what `reward_steps` takes."""
  m = shapes.mesh
  arrays = tuple(sds((rows,) + a.shape[1:], a.dtype, sharding_lib.batch_sharding(m, ndim=a.ndim))
                 for a in shapes.arrays)
  return arrays, sds((rows,), jnp.float32, sharding_lib.batch_sharding(m, ndim=1))


def state_sds(shapes: RewardShapes, params):
  """({MODEL: Slot(trees, opt_state)}, pi_ref) as shapes for `params` (shapes in their shardings):
  RewardModelRun.init_state's and reference's."""
  m, cfg = shapes.mesh, shapes.cfg
  head = {} if cfg.dpo_run else jax.eval_shape(functools.partial(init_reward_head, shapes.model_cfg.d_model),
                                                jax.random.key(0))
  head = with_shardings(head, head_shardings(m)) if head else head
  trees = {"params": params, HEAD_KEY: head}
  ref = jax.eval_shape(snapshot, params) if cfg.dpo_run else {}
  ref = with_shardings(ref, jax.tree.map(lambda a: a.sharding, params)) if ref else ref
  return {MODEL: Slot(trees, opt_sds(shapes.tx, trees, m))}, ref


def steps(shapes: RewardShapes, model_cfg, params, n_micro: int):
  """(learner, eval_step, slots, ref) of `reward_steps` for `n_micro` micro-batches of the run's size."""
  cfg = shapes.cfg
  rows = shapes.micro_batch_size * n_micro
  cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, batch_size=rows,
                                                           micro_batch_size=shapes.micro_batch_size))
  slots, ref = state_sds(shapes, params)
  arrays, weight = batch_sds(shapes, rows)
  shardings = tuple(a.sharding for a in arrays)
  learner, eval_step = reward_steps(cfg, model_cfg, shapes.tx, shardings, weight.sharding, slots,
                                    jax.tree.map(lambda a: a.sharding, ref))
  return learner, eval_step, slots, ref


@_in_mesh
def lower_reward_train(shapes: RewardShapes, model_cfg, params, n_micro: int):
  learner, _, slots, ref = steps(shapes, model_cfg, params, n_micro)
  return learner.lower(slots, {MODEL: None}, batch_sds(shapes, shapes.micro_batch_size * n_micro), ref)


@_in_mesh
def lower_reward_eval(shapes: RewardShapes, model_cfg, params, rows: int):
  _, eval_step, slots, ref = steps(shapes, model_cfg, params, shapes.n_micro)
  return eval_step.lower(slots[MODEL].params, batch_sds(shapes, rows), ref)


def _flops(shapes: RewardShapes, rows: int, train: bool):
  """The model FLOPs of `rows` rows: the trunk over every token (DPO: the head too, and pi_ref's forward)."""
  cfg = shapes.cfg
  seqs, T = rows * shapes.seqs_per_row, shapes.seq_len
  head_rows = seqs * T if cfg.dpo_run else 0  # a score head reads d_model -> 1: not counted

  def flops(mc) -> float:
    out = model_flops(mc, rows=seqs, seq=T, head_rows=head_rows, train=train)
    return out + (model_flops(mc, rows=seqs, seq=T, head_rows=head_rows, train=False) if cfg.dpo_run else 0.0)
  return flops


def reward_programs(shapes: RewardShapes) -> list[Program]:
  """Every program of a reward-model run of `shapes.cfg`."""
  B, micro, n = shapes.rows, shapes.micro_batch_size, shapes.n_micro
  what = {"bradley_terry": "pairs", "process": "solutions", "dpo": "pairs"}[shapes.cfg.objective]
  return [Program("reward/train", "update", lambda mc, p, k: lower_reward_train(shapes, mc, p, k), n, 1.0,
                  f"{shapes.cfg.objective}: {n} micro-batches of {micro} {what}, {shapes.seq_len} tokens each",
                  flops=_flops(shapes, B, True)),
          Program("reward/eval", "plain", lambda mc, p, _: lower_reward_eval(shapes, mc, p, B), 1, 0.0,
                  f"held out: {B} {what} a batch", flops=_flops(shapes, B, False))]
