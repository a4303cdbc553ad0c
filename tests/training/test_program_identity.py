"""The programs the compile command plans are the trainer's own: each built both ways for the same
run and device mesh lowers to the same StableHLO (tpu/programs.py takes the trainer's specs,
`UpdateSpec.from_run`, `RecomputeSpec.from_run`, `run_optimizers`, the SFT learner; a drift in a
keyword, an optimizer, a sharding or a donation shows here)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.compile import build_reward_shapes, build_shapes
from jaxrl_llm.learn.learner import Slot
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.reward_model.config import reward_config_from_dict
from jaxrl_llm.reward_model.defaults import reward_model_config
from jaxrl_llm.reward_model.trainer import MODEL, RewardModelRun
from jaxrl_llm.tpu import programs, reward_programs
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.recompute import RecomputeSpec
from jaxrl_llm.training.sft import sft_learner, sft_optimizer, sft_plan, sft_slots
from jaxrl_llm.training.step import update_aux
from jaxrl_llm.training.tiny import TINY_MODEL, apply_settings
from tests.run_helpers import load_config, make_trainer, shrink


def fingerprint(lowered) -> str:
  """The program's text without locations and metadata (names of source lines, not the program)."""
  text = lowered.as_text()
  text = re.sub(r"\s*loc\([^\n]*?\)(?=\n|$)", "", text)
  text = re.sub(r"#loc\d*\s*=.*\n", "", text)
  return text


def _run(tmp_path, name: str, **overrides):
  cfg = from_config_dict(shrink(load_config(name), **{"train.mini_batches": 2, "train.micro_batch_size": 8,
                                                     **overrides}))
  trainer = make_trainer(cfg, tmp_path / name, lambda s: None)
  state = trainer.setup_extensions(trainer.init_state(jax.random.key(0)))
  state = trainer.start_rl(state)
  shapes = build_shapes(trainer.cfg, "", jax.devices())
  return trainer, state, shapes


@pytest.fixture
def closing():
  """Closes the trainers a test builds (their reward runners and rollout engines)."""
  trainers = []
  yield trainers.append
  for t in trainers:
    t.runner.close()
    t.context.engine.close()


@pytest.mark.parametrize("name", ["gspo", "ppo", "sdpo"])
def test_update_and_recompute_lower_the_same_programs_as_the_run(tmp_path, closing, name):
  trainer, state, shapes = _run(tmp_path, name)
  closing(trainer)
  cfg, mc = trainer.cfg, trainer.model_cfg
  assert shapes.cfg.micro_batch_size == cfg.micro_batch_size and shapes.n_micro == 2
  params = programs.param_sds(mc, shapes.mesh)
  plan = programs.lower_update(shapes, mc, params, shapes.n_micro)
  _, extra_BR, _ = programs.teacher_loss_part(shapes, mc, cfg.mini_batch_size)
  batch = programs.train_batch(shapes, cfg.mini_batch_size, extra_BR)
  with jax.sharding.use_abstract_mesh(shapes.mesh.abstract_mesh):
    run = trainer.context.updater.lower(state.update_state(), batch, update_aux(trainer.context, state))
  assert fingerprint(run) == fingerprint(plan)

  # The recompute's chunk: the run's spec (padded layout) against the plan's.
  rows = cfg.micro_batch_size
  plan = programs.lower_recompute(shapes, mc, params, rows)
  m = shapes.mesh
  args = programs.train_batch(shapes, rows)
  args = (args.prompt_BP, args.prompt_mask_BP, args.tokens_BR, args.mask_BR, args.mask_BR, None)
  spec = RecomputeSpec.from_run(cfg, mc, sharding=sharding_lib.batch_sharding(m))
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = spec.lower_chunk(state.params, state.value_params, args, with_values=cfg.use_value)
  assert fingerprint(run) == fingerprint(plan)


def test_the_warm_start_lowers_the_same_program_as_the_run(tmp_path, closing):
  trainer, state, shapes = _run(tmp_path, "gspo", **{"sft.steps": 5, "sft.batch_size": 32,
                                                      "sft.micro_batch_size": 16})
  closing(trainer)
  cfg, mc, m = trainer.cfg, trainer.model_cfg, shapes.mesh
  plan = programs.lower_sft(shapes, mc, programs.param_sds(mc, m), cfg.sft.batch_size)
  sft = sft_plan(cfg)
  tx = sft_optimizer(sft)
  opt = sharding_lib.onto_mesh(tx.init(state.params), m)
  learner = sft_learner(mc, sft, tx, state.params, opt, sharding_lib.batch_sharding(m, ndim=1))
  P_, R = shapes.prompt_len, shapes.response_len
  b = cfg.sft.batch_size
  batch = (programs.row_sds(m, (b, P_), "int32"), programs.row_sds(m, (b, P_), "bool"),
           programs.row_sds(m, (b, R), "int32"), programs.row_sds(m, (b, R), "bool"))
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = learner.lower(*sft_slots(state.params, opt), batch, None)
  assert fingerprint(run) == fingerprint(plan)


def test_packed_update_and_recompute_lower_the_same_programs_as_the_run(tmp_path, closing):
  """train.pack=on: the packing the trainer's policy plans for a mini-batch of equal-length rows (step.py's
  call) against the plan's program for that layout; and the plan's own layout is the trainer's policy's
  bound (PackPolicy.largest)."""
  trainer, state, shapes = _run(tmp_path, "grpo", **{"train.pack": "on"})
  closing(trainer)
  cfg, mc, m, ctx = trainer.cfg, trainer.model_cfg, shapes.mesh, trainer.context
  P_, R = shapes.prompt_len, shapes.response_len
  rows, n_micro = cfg.mini_batch_size, shapes.n_micro
  assert programs.pack_policy(shapes) == ctx.pack
  assert programs.packed_layout(shapes, rows, n_micro) == ctx.pack.largest(rows // n_micro, P_, R, n_micro)
  progs = {p.name: p for p in programs.run_programs(shapes)}
  assert "update/packed" in progs and ("recompute/packed" in progs) == bool(shapes.recomputes)
  # The cost probes lower the packed update at loop_unit and twice that many micro-batches: valid layouts
  # (k chunks x n buffers over the batch shards), as is the run's own count.
  packed = progs["update/packed"]
  shards = sharding_lib.batch_shards(shapes.mesh)
  p_sds = programs.param_sds(trainer.model_cfg, shapes.mesh)
  for k in (packed.loop_unit, 2 * packed.loop_unit, n_micro):
    assert k * packed.layout[1] % shards == 0
    programs.lower_update(shapes, trainer.model_cfg, p_sds, k, packed.layout)
  # 3 buffers a chunk over 8 shards: valid from 8 micro-batches on, and 1 is no program (the plan of
  # Qwen3-8B on v5p-8 failed so, probing 1 micro-batch of a layout made for its 8).
  assert shards == 8 and programs.packed_loop_unit(shapes, 3) == 8 and programs.packed_loop_unit(shapes, 4) == 2
  with pytest.raises(ValueError, match="partitioned 8 times"):
    programs.lower_update(shapes, trainer.model_cfg, p_sds, 1, (packed.layout[0], 3))

  pmask, attend = np.ones((rows, P_), bool), np.arange(R)[None, :] < np.arange(rows)[:, None] % R + 1
  packing = ctx.pack.plan(pmask, attend, chunks=n_micro)
  layout = (packing.length, packing.src_nS.shape[0] // n_micro)
  params = programs.param_sds(mc, m)
  plan = programs.lower_update(shapes, mc, params, n_micro, layout)
  batch = programs.train_batch(shapes, rows).replace(packing=sharding_lib.put(packing, ctx.batch_sharding))
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = ctx.updater.lower(state.update_state(), batch, update_aux(ctx, state))
  assert fingerprint(run) == fingerprint(plan)

  chunk = cfg.micro_batch_size
  packing = ctx.pack.plan(pmask[:chunk], attend[:chunk])
  plan = programs.lower_recompute(shapes, mc, params, chunk, (packing.length, packing.src_nS.shape[0]))
  args = programs.train_batch(shapes, chunk)
  args = (args.prompt_BP, args.prompt_mask_BP, args.tokens_BR, args.mask_BR, args.mask_BR,
          sharding_lib.put(packing, ctx.batch_sharding))
  spec = RecomputeSpec.from_run(cfg, mc, sharding=ctx.batch_sharding, pack=ctx.pack)
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = spec.lower_chunk(state.params, state.value_params, args, with_values=cfg.use_value)
  assert fingerprint(run) == fingerprint(plan)


@pytest.mark.parametrize("objective", ["bradley_terry", "process", "dpo"])
def test_reward_model_training_lowers_the_same_programs_as_the_run(tmp_path, objective):
  """The reward-model run's optimizer step and held-out step (RewardModelRun) against the compile
  command's (tpu/reward_programs.py), in micro-batches."""
  settings = {**TINY_MODEL, "objective": objective, "train.batch_size": 16, "train.micro_batch_size": 8,
              "data.n_train": 64, "data.n_eval": 16, "export": False}
  if objective != "bradley_terry":
    settings["train.center_coef"] = 0.0
  cfg = reward_config_from_dict(apply_settings(reward_model_config(), settings))
  run = RewardModelRun(cfg, str(tmp_path / objective), log=lambda s: None)
  state = run.init_state()
  if cfg.dpo_run:
    run.ref_params = run.reference(state, resuming=False)
  run._compile(state)  # pylint: disable=protected-access
  shapes = build_reward_shapes(cfg, "", jax.devices())
  mc, m = shapes.model_cfg, shapes.mesh
  assert shapes.n_micro == 2 and shapes.seq_len == run.data.max_len and mc == run.model_cfg
  params = programs.param_sds(mc, m)
  names = [p.name for p in reward_programs.reward_programs(shapes)]
  assert names == ["reward/train", "reward/eval"]

  plan = reward_programs.lower_reward_train(shapes, mc, params, shapes.n_micro)
  batch = reward_programs.batch_sds(shapes, cfg.train.batch_size)
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    got = run.learner.lower({MODEL: Slot(state.trees(), state.opt_state)}, {MODEL: None}, batch, run.ref_params)
  assert fingerprint(got) == fingerprint(plan)

  plan = reward_programs.lower_reward_eval(shapes, mc, params, cfg.train.batch_size)
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    got = run.eval_step.lower(state.trees(), batch, run.ref_params)
  assert fingerprint(got) == fingerprint(plan)


def test_the_exact_recompute_lowers_the_same_program_as_the_run(tmp_path, closing):
  """rollout.exact: the recompute runs each row alone (model/invariant.py's rowwise program); the plan
  lowers that program, not the batched chunk."""
  trainer, state, shapes = _run(tmp_path, "gspo", **{"rollout.exact": True})
  closing(trainer)
  cfg, mc, m = trainer.cfg, trainer.model_cfg, shapes.mesh
  rows = cfg.micro_batch_size
  plan = programs.lower_recompute(shapes, mc, programs.param_sds(mc, m), rows)
  assert "rowwise_logprobs" in plan.as_text()[:2000]
  args = programs.train_batch(shapes, rows)
  args = (args.prompt_BP, args.prompt_mask_BP, args.tokens_BR, args.mask_BR, args.mask_BR, None)
  spec = RecomputeSpec.from_run(cfg, mc, sharding=trainer.context.batch_sharding, pack=trainer.context.pack)
  assert spec.rowwise
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = spec.lower_chunk(state.params, state.value_params, args, with_values=cfg.use_value)
  assert fingerprint(run) == fingerprint(plan)
  # The engine's log mu (sampling/exact.py): the same row-wise program on the sampler's weights.
  from jaxrl_llm.model.invariant import rowwise_logprobs
  from jaxrl_llm.sampling.exact import exact_static
  from jaxrl_llm.sampling.loop import cast_params

  (prog,) = [p for p in programs.run_programs(shapes) if p.name == "rollout/exact"]
  assert prog.rows == rows and prog.calls_per_step == cfg.rollout.batch_size / rows
  plan = programs.lower_exact(shapes, mc, programs.param_sds(mc, m), rows)
  static = exact_static(mc, trainer.sampling_cfg, impl=cfg.kernels.impl, shards=sharding_lib.batch_shards(m))
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    run = rowwise_logprobs.lower(cast_params(state.params, trainer.sampling_cfg.dtype), *args[:5], **static)
  assert fingerprint(run) == fingerprint(plan)
  # The verification of its tokens (sampling/verify.py): the draws the engine runs, the plan's program.
  from jaxrl_llm.sampling import verify

  (prog,) = [p for p in programs.run_programs(shapes) if p.name == "rollout/verify"]
  assert prog.rows == rows and prog.calls_per_step == cfg.rollout.batch_size / rows
  plan = programs.lower_exact(shapes, mc, programs.param_sds(mc, m), rows, draws=True)
  keys = sharding_lib.put(verify.step_key_data(jax.random.key(0), jnp.arange(rows, dtype=jnp.int32),
                                               args[2].shape[1]), trainer.context.batch_sharding)
  with jax.sharding.use_abstract_mesh(m.abstract_mesh):
    params = cast_params(state.params, trainer.sampling_cfg.dtype)
    hidden = rowwise_logprobs.eval_shape(params, *args[:5], **static)[1]
    hidden = jax.ShapeDtypeStruct(hidden.shape, hidden.dtype, sharding=trainer.context.batch_sharding)
    run = verify.head_draws.lower(params, hidden, args[3], keys, model_cfg=static["model_cfg"],
                                  cfg=trainer.sampling_cfg, shards=static["shards"])
  assert fingerprint(run) == fingerprint(plan)
