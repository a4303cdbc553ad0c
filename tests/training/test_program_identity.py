"""The programs the compile command plans are the trainer's own: each built both ways for the same
run and device mesh lowers to the same StableHLO (tpu/programs.py takes the trainer's specs,
`UpdateSpec.from_run`, `RecomputeSpec.from_run`, `run_optimizers`, the SFT learner; a drift in a
keyword, an optimizer, a sharding or a donation shows here)."""

import re

import jax
import pytest

from jaxrl_llm.compile import build_shapes
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.tpu import programs
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.recompute import RecomputeSpec
from jaxrl_llm.training.sft import sft_learner, sft_optimizer, sft_plan, sft_slots
from jaxrl_llm.training.step import update_aux
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
