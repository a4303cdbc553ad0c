"""The jitted programs of one run, as shapes over a topology's devices: what `jaxrl_llm.compile` compiles.

`run_programs(plan)` returns every program a run of the config compiles,
built from the functions and specs the trainer itself runs (`UpdateSpec.from_run`,
`RecomputeSpec.from_run`, `PackPolicy.from_run`, `run_optimizers`, `sft_learner`; nothing is copied, and
tests/training/test_program_identity.py finds the same StableHLO both ways):

| program | function | calls per RL step |
|---|---|---|
| rollout/sync | the sampler's copy under rollout.sampler_sharding=tensor (sampling/engine.py's sampler_gather) | 1 |
| rollout/prefill | sampling.loop.prefill | 1 (dynamic sampling's refills not counted) |
| rollout/decode | sampling.loop.decode | 1 (forecast: every row to max_response_len) |
| rollout/exact | rollout.exact: log mu by the recompute's row-wise program (sampling/exact.py) | rows / micro-batch |
| rollout/verify | rollout.exact: the tokens' draws from that program's hidden states (sampling/verify.py) | rows / micro-batch |
| recompute | training.recompute's chunk (log pi_prox, log pi_ref, values) | rows / micro-batch, per recompute the run makes |
| recompute/packed | a chunk in the bound on the packings train.pack runs (PackPolicy.largest) | 0 (for a padded one) |
| update | training.update.Updater (learn/learner.py) | epochs x mini-batches |
| update/packed | the update, each micro-batch in that bound | 0 (replaces a padded update) |
| sft | training.sft.sft_learner (learn/learner.py) | none (the warm start: sft.steps of them) |
| eval/prefill, eval/decode | the greedy sampler of evaluation.Evaluator | none (start and end of a run) |

Each program lowers from ShapeDtypeStructs carrying the run's shardings over
the mesh of `mesh.*` on the topology's devices, under that mesh as the
abstract mesh in context, as the trainer steps: so `kernels.impl=auto` picks
the Mosaic kernels for a TPU topology (kernels/target.py).

A program's `lower(model_cfg, params, loop)` takes the model config, the
params as shapes (stacked [L, ...] as the run holds them, or unstacked: the
cost probes of tpu/forecast.py unroll the layers) and the count of its one
loop (update: micro-batches; decode: the cache length of one step).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm import model as model_lib
from jaxrl_llm.model import lora
from jaxrl_llm.model.heads import init_value_head
from jaxrl_llm.model.packing import Packing
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.sampling import loop as sampler_loop
from jaxrl_llm.sampling.generate import sampler_model_config
from jaxrl_llm.training import recompute as recompute_lib
from jaxrl_llm.training.batch import AUX_BEHAV_HEAD, TrainBatch
from jaxrl_llm.training.pack import PackPolicy
from jaxrl_llm.training.sft import sft_learner, sft_optimizer, sft_plan, sft_slots
from jaxrl_llm.training.update import UpdateSpec, UpdateState, make_updater

@dataclasses.dataclass(frozen=True)
class RunShapes:
  """The run config's (after `with_micro_batch`) and model's shapes, on a mesh."""

  cfg: Any  # training.config.RunConfig, data.max_prompt_len and train.micro_batch_size resolved
  model_cfg: model_lib.ModelConfig
  mesh: jax.sharding.Mesh
  sampling: Any  # sampling.config.SamplingConfig of the rollouts
  eval_sampling: Any  # the greedy evaluation's
  tx: Any  # the policy's optax transformation
  vtx: Any  # the value head's
  eval_rows: int  # rows of one evaluation batch

  @property
  def prompt_len(self) -> int:
    return self.cfg.data.max_prompt_len

  @property
  def response_len(self) -> int:
    return self.cfg.rollout.max_response_len

  @property
  def rows(self) -> int:
    """Samples per RL step (prompts x group)."""
    return self.cfg.rollout.batch_size

  @property
  def n_micro(self) -> int:
    return self.cfg.mini_batch_size // self.cfg.micro_batch_size

  @property
  def param_copies(self) -> int:
    """Copies of the trained params held beside every program: pi_ref, the lagged samplers."""
    cfg = self.cfg
    return int(cfg.objective.needs_ref or cfg.log.kl_to_ref) + cfg.rollout.staleness

  @property
  def step_tokens(self) -> tuple[int, str]:
    """(tokens a step makes, what they are): the rollout's sampled tokens."""
    return self.rows * self.response_len, "sampled"

  @property
  def recomputes(self) -> int:
    """Forward passes over the step's rows before the updates: pi_prox (training/prox.py), pi_ref."""
    cfg = self.cfg
    return int(cfg.prox.forward) + int(cfg.objective.needs_ref or cfg.log.kl_to_ref)


@dataclasses.dataclass(frozen=True)
class Program:
  """One jitted program of a run. `lower(model_cfg, params, loop)` lowers it for a model config and
  params as shapes (stacked or unstacked) with `loop` iterations of its one loop; decode programs
  lower from their prefill's state instead (`lower_decode`, `lower_decode_step`)."""

  name: str
  kind: str  # "prefill", "decode" (follows the prefill before it), "plain" or "update" (a micro-batch loop)
  lower: Callable[[model_lib.ModelConfig, Any, int], Any] | None
  loop: int  # the run's micro-batches (update), else 1
  calls_per_step: float  # runs per RL step; 0: outside the RL steps (warm start, evaluation)
  note: str = ""
  sampling: Any = None  # prefill / decode: the SamplingConfig
  rows: int = 0  # prefill / decode: prompts in (the decode's rows are rows x n_samples); rollout/exact: rows a program
  params_view: Callable[[Any], Any] | None = None  # params shapes -> the program's copy (the sampler's layout)
  layout: tuple[int, int] | None = None  # a packed program's (S, buffers per chunk): PackPolicy.largest
  flops: Callable[[Any], float] | None = None  # model config -> its model FLOPs (None: tpu/forecast.py's rule)
  # an "update"'s valid loop counts are multiples of this (a packed update's chunks x buffers split over the
  # batch shards): the cost probes lower it at loop_unit and 2 x loop_unit micro-batches
  loop_unit: int = 1


# ---------------------------------------------------------------- shapes with shardings


def sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  dtype = dtype if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) else jnp.dtype(dtype)
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def with_shardings(shapes, shardings):
  return jax.tree.map(lambda s, sh: sds(s.shape, s.dtype, sh), shapes, shardings)


def param_sds(model_cfg, mesh, *, unstacked: bool = False):
  """The params as shapes in their shardings; `unstacked`: "layers" as a tuple of per-layer dicts
  (model.unstack_layers' form, whose forward runs the layers unrolled)."""
  params = with_shardings(model_lib.param_shapes(model_cfg), sharding_lib.param_shardings(model_cfg, mesh))
  if not unstacked:
    return params

  def layer(x):  # drop the leading (replicated) layer axis of shape and spec
    return sds(x.shape[1:], x.dtype, NamedSharding(mesh, P(*x.sharding.spec[1:])))

  one = {name.replace("_L", "_", 1): layer(x) for name, x in params["layers"].items()}
  return {**params, "layers": (one,) * model_cfg.n_layers}


def opt_sds(tx, params, mesh):
  """optax state of `params` as shapes: each param's moments sharded like it, counters replicated."""
  shapes = jax.eval_shape(tx.init, params)
  shardings = optax.tree_map_params(tx, lambda _, p: p.sharding, shapes, params,
                                    transform_non_params=lambda _: sharding_lib.replicated(mesh))
  return with_shardings(shapes, shardings)


def in_dtype(tree, dtype):
  """Shapes of `tree` with its floating leaves in `dtype` (None: as they are), as sampling.loop.cast_params
  casts the params for the sampler."""
  if dtype is None:
    return tree
  return jax.tree.map(lambda x: sds(x.shape, dtype, x.sharding) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      tree)


def bytes_per_chip(tree) -> int:
  """Bytes one chip holds of a tree of sharded shapes."""
  return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def row_sds(mesh, shape, dtype):
  """An array whose leading axis is the batch (over data x fsdp)."""
  return sds(shape, dtype, sharding_lib.batch_sharding(mesh, len(shape)))


def _key(mesh):
  key = jax.eval_shape(lambda: jax.random.key(0))
  return sds(key.shape, key.dtype, sharding_lib.replicated(mesh))


# ---------------------------------------------------------------- the programs


def _in_mesh(fn):
  """Lowers under the run's mesh as the abstract mesh, as the trainer's steps run."""
  @functools.wraps(fn)
  def lower(shapes: RunShapes, *args, **kwargs):
    with jax.sharding.use_abstract_mesh(shapes.mesh.abstract_mesh):
      return fn(shapes, *args, **kwargs)
  return lower


def _prompts(shapes: RunShapes, rows: int):
  shape = (rows, shapes.prompt_len)
  return row_sds(shapes.mesh, shape, jnp.int32), row_sds(shapes.mesh, shape, jnp.bool_)


@_in_mesh
def lower_prefill(shapes: RunShapes, scfg, rows: int, model_cfg, params, cache_len: int):
  tokens, mask = _prompts(shapes, rows)
  return sampler_loop.prefill.lower(params, tokens, mask, _key(shapes.mesh),
                                    model_cfg=sampler_model_config(model_cfg, scfg), cfg=scfg, cache_len=cache_len,
                                    mesh=shapes.mesh, data_axis=sharding_lib.BATCH_AXES)


@_in_mesh
def lower_decode(shapes: RunShapes, scfg, model_cfg, params, state):
  return sampler_loop.decode.lower(params, state, model_cfg=sampler_model_config(model_cfg, scfg), cfg=scfg,
                                   prompt_len=shapes.prompt_len, mesh=shapes.mesh, data_axis=sharding_lib.BATCH_AXES)


@_in_mesh
def lower_decode_step(shapes: RunShapes, scfg, model_cfg, params, state):
  """One iteration of the decode loop (`loop.decode_step`) on unstacked params in the sampler's dtype."""
  run_cfg = sampler_model_config(model_cfg, scfg)
  step = jax.jit(functools.partial(sampler_loop.decode_step, model_cfg=run_cfg, cfg=scfg, mesh=shapes.mesh,
                                   data_axis=sharding_lib.BATCH_AXES), donate_argnums=(1,))
  return step.lower(in_dtype(params, scfg.dtype), state)  # as the loop holds them: cast once, before it


def resized(state, cache_len: int):
  """A decode state's shapes with the KV cache cut or padded to `cache_len` slots (`KVCache.resize`)."""
  def fix(path, x):
    names = [getattr(k, "name", getattr(k, "key", None)) for k in path]
    if "cache" in names and x.ndim >= 2 and names[-1] != "index":
      axis = {"k_BKHS": 3, "v_BKSH": 2, "mask_BS": 1, "positions_BS": 1}[next(n for n in names if n in (
          "k_BKHS", "v_BKSH", "mask_BS", "positions_BS"))]
      shape = list(x.shape)
      shape[axis] = cache_len
      return sds(shape, x.dtype, x.sharding)
    return x
  return jax.tree_util.tree_map_with_path(fix, state)


@_in_mesh
def lower_exact(shapes: RunShapes, model_cfg, params, rows: int, *, draws: bool = False):
  """rollout.exact: log mu of `rows` finished rows by the trainer's row-wise program on the sampler's
  weights in its dtype (sampling/exact.py's exact_logprobs); draws: the verification's draws from that
  program's hidden states (sampling/verify.py's head_draws)."""
  from jaxrl_llm.model.invariant import rowwise_logprobs  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.sampling import verify  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.sampling.exact import exact_static  # pylint: disable=import-outside-toplevel

  scfg, m = shapes.sampling, shapes.mesh
  P_, R = shapes.prompt_len, shapes.response_len
  params = in_dtype(params, scfg.dtype)  # as exact_logprobs casts them (sampling.loop.cast_params)
  args = (row_sds(m, (rows, P_), jnp.int32), row_sds(m, (rows, P_), jnp.bool_), row_sds(m, (rows, R), jnp.int32),
          row_sds(m, (rows, R), jnp.bool_))
  static = exact_static(model_cfg, scfg, impl=shapes.cfg.kernels.impl, shards=sharding_lib.batch_shards(m))
  if draws:
    hidden = row_sds(m, (rows, R, model_cfg.d_model), static["model_cfg"].compute_dtype)
    return verify.head_draws.lower(params, hidden, args[3], row_sds(m, (rows, R, 2), jnp.uint32),
                                   model_cfg=static["model_cfg"], cfg=scfg, shards=static["shards"])
  return rowwise_logprobs.lower(params, *args, args[-1], **static)


def _value_sds(shapes: RunShapes):
  vshapes = jax.eval_shape(lambda: init_value_head(shapes.model_cfg.d_model, jax.random.key(0)))
  return with_shardings(vshapes, jax.tree.map(lambda _: sharding_lib.replicated(shapes.mesh), vshapes))


def pack_policy(shapes: RunShapes) -> PackPolicy:
  """The run's packing rule (`train.pack`), as the trainer builds it."""
  return PackPolicy.from_run(shapes.cfg, shapes.model_cfg, sharding_lib.batch_shards(shapes.mesh))


def packing_sds(shapes: RunShapes, layout: tuple[int, int] | None, rows: int, chunks: int = 1) -> Packing | None:
  """The model/packing.Packing of `rows` rows in `chunks` chunks of n buffers of S slots each
  (`layout` = (S, n), PackPolicy.largest), as shapes placed like the batch; None for the padded layout."""
  if layout is None:
    return None
  S, n = layout
  i32 = lambda *shape: row_sds(shapes.mesh, shape, jnp.int32)  # noqa: E731
  return Packing(src_nS=i32(chunks * n, S), positions_nS=i32(chunks * n, S), segments_nS=i32(chunks * n, S),
                 dst_BR=i32(rows, shapes.response_len), group=shapes.cfg.prompt_group)


def packed_layout(shapes: RunShapes, rows: int, chunks: int = 1) -> tuple[int, int] | None:
  """(S, buffers per chunk) bounding the packings `train.pack` runs for `chunks` chunks of `rows` rows in
  all (PackPolicy.largest: no batch is packed at more forward FLOPs), or None where it never packs them."""
  return pack_policy(shapes).largest(rows // chunks, shapes.prompt_len, shapes.response_len, chunks)


def packed_loop_unit(shapes: RunShapes, buffers: int) -> int:
  """The least micro-batch count k for which k chunks of `buffers` buffers split over the batch shards
  (every multiple of it does): what a packed update may be lowered at besides the run's own count."""
  shards = sharding_lib.batch_shards(shapes.mesh)
  return shards // int(np.gcd(shards, buffers))


@_in_mesh
def lower_recompute(shapes: RunShapes, model_cfg, params, rows: int, layout: tuple[int, int] | None = None):
  """A recompute chunk of `rows` rows: padded, or packed in `layout` = (S, buffers)."""
  cfg, m = shapes.cfg, shapes.mesh
  P_, R = shapes.prompt_len, shapes.response_len
  # (prompt, its mask, response tokens, the tokens attended, the sampled ones: RecomputeSpec.run_chunk's rows)
  args = (row_sds(m, (rows, P_), jnp.int32), row_sds(m, (rows, P_), jnp.bool_), row_sds(m, (rows, R), jnp.int32),
          row_sds(m, (rows, R), jnp.bool_), row_sds(m, (rows, R), jnp.bool_))
  spec = recompute_lib.RecomputeSpec.from_run(cfg, model_cfg, sharding=sharding_lib.batch_sharding(m))
  return spec.lower_chunk(params, _value_sds(shapes), args + (packing_sds(shapes, layout, rows),),
                          with_values=cfg.use_value)


HINT_TOKENS = 64  # teacher.context=hint: tokens the hint adds to the teacher's context (a plan's assumption)


@_in_mesh
def lower_teacher(shapes: RunShapes, model_cfg, params, rows: int):
  """The teacher's scoring pass over `rows` samples (teacher/stage.py's `score_chunk`): the teacher
  reads its context + the response, the student its prompt + the response, and the vocabulary ops
  give log q, log p, H(q), KL(p || q) (and the teacher's top-k or hidden states for the loss forms).
  The teacher has the student's shapes (a self or warm-started teacher; a checkpoint teacher of
  another size is not planned)."""
  from jaxrl_llm.teacher import stage as teacher_stage  # pylint: disable=import-outside-toplevel

  cfg, m = shapes.cfg, shapes.mesh
  t = cfg.teacher
  P_, R = shapes.prompt_len, shapes.response_len
  C = P_ + (HINT_TOKENS if t.context == "hint" else 0)
  spec = teacher_stage.ScoreSpec(
      teacher_cfg=model_cfg, student_cfg=model_cfg, temperature=cfg.rollout.temperature, impl=cfg.kernels.impl,
      topk=t.topk, keep_hidden=bool(t.loss_form and not t.topk))
  args = (row_sds(m, (rows, C), jnp.int32), row_sds(m, (rows, C), jnp.bool_), row_sds(m, (rows, P_), jnp.int32),
          row_sds(m, (rows, P_), jnp.bool_), row_sds(m, (rows, R), jnp.int32), row_sds(m, (rows, R), jnp.bool_))
  return teacher_stage.score_chunk.lower(params, params, *args, spec=spec)


def teacher_loss_part(shapes: RunShapes, model_cfg, rows: int):
  """A loss-form teacher's part of the update (teacher/loss.py's DistillTerm): (extra_terms, the batch's
  extra_BR shapes, the aux shapes); nothing for an advantage-form teacher or none."""
  from jaxrl_llm.teacher import loss as teacher_loss  # pylint: disable=import-outside-toplevel

  cfg, m, t = shapes.cfg, shapes.mesh, shapes.cfg.teacher
  if not (t.enabled and t.loss_form):
    return (), {}, {}
  term = teacher_loss.DistillTerm(model_cfg, t.divergence, t.jsd_beta, cfg.rollout.temperature,
                                  cfg.objective.aggregation, impl=cfg.kernels.impl, topk=t.topk,
                                  topk_tail=t.topk_tail, n_teachers=1)
  R = shapes.response_len
  extra = {teacher_loss.WEIGHT: row_sds(m, (rows, R), jnp.float32)}
  aux = {}
  if t.topk:
    extra[teacher_loss.TOPK_IDS] = row_sds(m, (rows, R, t.topk), jnp.int32)
    extra[teacher_loss.TOPK_LOGP] = row_sds(m, (rows, R, t.topk), jnp.float32)
  else:  # the teacher's hidden states and its head (the student's shapes)
    extra[teacher_loss.HIDDEN] = row_sds(m, (rows, R, model_cfg.d_model), jnp.float32)
    head = jax.eval_shape(lambda p: model_lib.lm_head(p, model_cfg), model_lib.param_shapes(model_cfg))
    aux[teacher_loss.head_key(0)] = sds(head.shape, head.dtype, sharding_lib.head_sharding(m))
  return (("teacher", term),), extra, aux


def train_batch(shapes: RunShapes, rows: int, extra_BR: dict | None = None, packing: Packing | None = None
                ) -> TrainBatch:
  """The update's mini-batch as shapes: rows over data x fsdp; `packing`: its Packing (packing_sds)."""
  cfg, m, mc = shapes.cfg, shapes.mesh, shapes.model_cfg
  obj = cfg.objective
  P_, R = shapes.prompt_len, shapes.response_len
  K = cfg.rollout.record_topk if obj.needs_centering else 0
  D = mc.d_model if obj.needs_token_kl else 0
  hidden_dtype = shapes.sampling.dtype or mc.compute_dtype
  f = lambda *shape: row_sds(m, shape, jnp.float32)  # noqa: E731
  return TrainBatch(
      prompt_BP=row_sds(m, (rows, P_), jnp.int32), prompt_mask_BP=row_sds(m, (rows, P_), jnp.bool_),
      tokens_BR=row_sds(m, (rows, R), jnp.int32), mask_BR=row_sds(m, (rows, R), jnp.bool_), behav_logp_BR=f(rows, R),
      prox_logp_BR=f(rows, R), ref_logp_BR=f(rows, R), adv_BR=f(rows, R), returns_BR=f(rows, R),
      old_values_BR=f(rows, R), topk_ids_BRK=row_sds(m, (rows, R, K), jnp.int32), topk_logp_BRK=f(rows, R, K),
      behav_hidden_BRD=row_sds(m, (rows, R, D), hidden_dtype), extra_BR=dict(extra_BR or {}), packing=packing)


@_in_mesh
def lower_update(shapes: RunShapes, model_cfg, params, n_micro: int, layout: tuple[int, int] | None = None):
  """The update (training/update.py's Updater, as Trainer.make_updater builds it) on n_micro
  micro-batches of the run's micro-batch size: padded, or each packed in `layout` = (S, buffers)."""
  cfg, m = shapes.cfg, shapes.mesh
  vparams = _value_sds(shapes)
  state = UpdateState(params=params, opt_state=opt_sds(shapes.tx, lora.trainable(params), m), value_params=vparams,
                      value_opt_state=opt_sds(shapes.vtx, vparams, m))
  rows = cfg.micro_batch_size * n_micro
  terms, extra_BR, aux = teacher_loss_part(shapes, model_cfg, rows)
  spec = dataclasses.replace(UpdateSpec.from_run(cfg, model_cfg, terms), n_micro=n_micro)
  updater = make_updater(spec, shapes.tx, shapes.vtx, state, sharding_lib.batch_sharding(m),
                         sharding_lib.replicated(m))
  if cfg.objective.needs_token_kl:  # TRM: the sampler's head, split over vocab like the policy's
    head = model_lib.lm_head(params, model_cfg)
    aux[AUX_BEHAV_HEAD] = sds(head.shape, shapes.sampling.dtype or head.dtype, sharding_lib.head_sharding(m))
  batch = train_batch(shapes, rows, extra_BR, packing_sds(shapes, layout, rows, n_micro))
  return updater.lower(state, batch, aux)


@_in_mesh
def lower_sft(shapes: RunShapes, model_cfg, params, rows: int):
  """The warm start's step (training/sft.py's learner, as run_sft builds it) on `rows` demonstrations
  in micro-batches of sft.micro_batch_size."""
  cfg, m = shapes.cfg, shapes.mesh
  plan = sft_plan(cfg)
  plan = dataclasses.replace(plan, batch_size=rows, micro_batch_size=min(plan.micro_batch_size, rows))
  tx = sft_optimizer(plan)
  opt = opt_sds(tx, lora.trainable(params), m)
  learner = sft_learner(model_cfg, plan, tx, params, opt, sharding_lib.batch_sharding(m, ndim=1))
  P_, R = shapes.prompt_len, shapes.response_len
  batch = (row_sds(m, (rows, P_), jnp.int32), row_sds(m, (rows, P_), jnp.bool_), row_sds(m, (rows, R), jnp.int32),
           row_sds(m, (rows, R), jnp.bool_))
  return learner.lower(*sft_slots(params, opt), batch, None)


def sampler_copy(scfg, params):
  """The params as the built-in sampler holds them under rollout.sampler_sharding='tensor'
  (sampling/engine.py's sampler_gather): in the sampler's dtype, not split over fsdp. Works on the
  stacked and the unstacked form (only "fsdp" leaves the specs)."""
  def view(x):
    spec = [None if a == "fsdp" else tuple(b for b in a if b != "fsdp") or None if isinstance(a, tuple) else a
            for a in x.sharding.spec]
    dtype = scfg.dtype if scfg.dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    return sds(x.shape, dtype, NamedSharding(x.sharding.mesh, P(*spec)))
  return jax.tree.map(view, params)


@_in_mesh
def lower_sampler_gather(shapes: RunShapes, scfg, params):
  """The sync of rollout.sampler_sharding='tensor': cast and gather over fsdp into the sampler's copy."""
  out = jax.tree.map(lambda x: x.sharding, sampler_copy(scfg, params))
  return jax.jit(lambda p: sampler_loop.cast_params(p, scfg.dtype), out_shardings=out).lower(params)


def run_programs(shapes: RunShapes) -> list[Program]:
  """Every program of a run of `shapes.cfg`, in the order a step meets them."""
  cfg = shapes.cfg
  B, G, chunk = shapes.rows, cfg.rollout.group_size, cfg.micro_batch_size
  scfg, ecfg, E = shapes.sampling, shapes.eval_sampling, shapes.eval_rows
  P_ = shapes.prompt_len

  def prefill(sc, rows):
    return lambda mc, p, _: lower_prefill(shapes, sc, rows, mc, p, sc.cache_slots(P_))

  out, view = [], None
  # train.pack: the packed programs the run may compile beside the padded ones (forecast: the padded
  # ones, whose forward costs more wherever the run packs)
  rec_layout = packed_layout(shapes, chunk) if shapes.recomputes and not cfg.rollout.exact else None
  upd_layout = packed_layout(shapes, cfg.mini_batch_size, shapes.n_micro)
  if cfg.rollout.sampler_sharding == "tensor":
    out.append(Program("rollout/sync", "plain", lambda mc, p, _: lower_sampler_gather(shapes, scfg, p), 1, 1.0,
                       "the sampler's copy: cast and gathered over fsdp"))
    view = functools.partial(sampler_copy, scfg)
  out += [Program("rollout/prefill", "prefill", prefill(scfg, B // G), 1, 1.0, f"{B // G} prompts", scfg, B // G,
                  view),
          Program("rollout/decode", "decode", None, 1, 1.0,
                  f"{B} rows; forecast: every row decodes max_response_len tokens", scfg, B // G, view)]
  if cfg.rollout.exact:
    from jaxrl_llm.sampling.exact import exact_chunk  # pylint: disable=import-outside-toplevel

    xc = exact_chunk(B, chunk)
    out += [Program("rollout/exact", "plain", lambda mc, p, _: lower_exact(shapes, mc, p, xc), 1, B / xc,
                    f"rollout.exact: log mu of {B // xc} chunks of {xc} rows, row by row "
                    "(model/invariant.py), on the sampler's weights", rows=xc, params_view=view),
            Program("rollout/verify", "plain", lambda mc, p, _: lower_exact(shapes, mc, p, xc, draws=True), 1, B / xc,
                    f"rollout.exact: the tokens verified, {B // xc} chunks of {xc} rows, row by row "
                    "(sampling/verify.py; forecast: one round, no row decoded again)", rows=xc, params_view=view)]
  if shapes.recomputes:
    what = "+".join(n for n, on in (("pi_prox", cfg.prox.forward),
                                    ("pi_ref", cfg.objective.needs_ref or cfg.log.kl_to_ref)) if on)
    out.append(Program("recompute", "plain", lambda mc, p, _: lower_recompute(shapes, mc, p, chunk), 1,
                       shapes.recomputes * (B // chunk), f"{what}: {B // chunk} chunks of {chunk} rows each"
                       + (", row by row (rollout.exact: model/invariant.py)" if cfg.rollout.exact else "")))
  if cfg.teacher.enabled:
    chunk_t = min(chunk, B)
    out.append(Program("teacher", "plain", lambda mc, p, _: lower_teacher(shapes, mc, p, chunk_t), 1, B / chunk_t,
                       f"{cfg.teacher.source} teacher, context {cfg.teacher.context}: {B // chunk_t} chunks of "
                       f"{chunk_t} rows (the student's shapes)"))
  if rec_layout is not None:
    S, n = rec_layout
    out.append(Program("recompute/packed", "plain",
                       lambda mc, p, _: lower_recompute(shapes, mc, p, chunk, rec_layout), 1, 0.0,
                       f"the bound on the packings train.pack={cfg.train.pack} runs a chunk in: {n} buffers of "
                       f"{S} slots (in place of a padded chunk)", layout=rec_layout))
  out.append(Program("update", "update", lambda mc, p, n: lower_update(shapes, mc, p, n), shapes.n_micro,
                     cfg.train.epochs * cfg.train.mini_batches, f"{shapes.n_micro} micro-batches of {chunk} rows"))
  if upd_layout is not None:
    S, n = upd_layout
    out.append(Program("update/packed", "update", lambda mc, p, k: lower_update(shapes, mc, p, k, upd_layout),
                       shapes.n_micro, 0.0, f"the bound on the packings train.pack={cfg.train.pack} runs a micro-batch "
                       f"in: {n} buffers of {S} slots (in place of a padded update)", layout=upd_layout,
                       loop_unit=packed_loop_unit(shapes, n)))
  if cfg.sft.steps:
    out.append(Program("sft", "plain", lambda mc, p, _: lower_sft(shapes, mc, p, cfg.sft.batch_size), 1, 0.0,
                       f"warm start: {cfg.sft.steps} steps of {cfg.sft.batch_size} rows"
                       + (f" in micro-batches of {cfg.sft.micro_batch_size}" if cfg.sft.micro_batch_size else "")))
  out += [Program("eval/prefill", "prefill", prefill(ecfg, E), 1, 0.0, f"greedy, {E} rows", ecfg, E),
          Program("eval/decode", "decode", None, 1, 0.0, f"greedy, {E} rows", ecfg, E)]
  return out
