"""`init_checkpoint`: a new run's params from an earlier run's workdir or a HF directory."""

import os

import jax
import numpy as np
import optax
import pytest

from jaxrl_llm.checkpointing import (
    CheckpointManager, IncompatibleCheckpointError, NoCheckpointError)
from jaxrl_llm.checkpointing.init_params import params_from_checkpoint as init_params
from jaxrl_llm.model import ModelConfig, init_params as model_init_eager
from jaxrl_llm.model.io.hf_io import save_hf

CFG = ModelConfig.tiny(vocab_size=24, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1,
                       head_dim=16, d_ff=64)
# One compiled init instead of many eager ops (eager costs ~20 s on a busy 2-core box).
model_init = jax.jit(model_init_eager, static_argnums=0)


def assert_tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def save_run(workdir, steps):
  """A run's checkpoints: params differ per step (init seed = step)."""
  with CheckpointManager(os.path.join(workdir, "checkpoints"), model_config=CFG) as m:
    for s in steps:
      params = model_init(CFG, jax.random.key(s))
      m.save(s, {"params": params, "opt": jax.jit(optax.adam(1e-3).init)(params),
                 "key": jax.random.key(0)}, data_state={"i": s})


@pytest.mark.slow
def test_from_workdir_latest_and_explicit_step(tmp_path):
  save_run(tmp_path, [1, 2])
  target = model_init(CFG, jax.random.key(99))
  params, src = init_params(str(tmp_path), target, CFG)
  assert src.startswith("step 2 of ")
  assert_tree_equal(params, model_init(CFG, jax.random.key(2)))
  params, src = init_params(str(tmp_path), target, CFG, step=1)
  assert src.startswith("step 1 of ")
  assert_tree_equal(params, model_init(CFG, jax.random.key(1)))


def test_from_hf_directory(tmp_path):
  saved = model_init(CFG, jax.random.key(5))
  save_hf(saved, CFG, str(tmp_path / "hf"))
  params, src = init_params(str(tmp_path / "hf"), model_init(CFG, jax.random.key(0)), CFG)
  assert src == f"Hugging Face directory {tmp_path / 'hf'}"
  assert_tree_equal(params, saved)  # float32 on disk and in the run: bit-exact


def test_incompatible_and_missing_sources_are_named(tmp_path):
  save_run(tmp_path / "run", [1])
  bigger = CFG.replace(d_model=64)
  with pytest.raises(IncompatibleCheckpointError, match="d_model: expected 64, found 32"):
    init_params(str(tmp_path / "run"), model_init(bigger, jax.random.key(0)), bigger)
  save_hf(model_init(CFG, jax.random.key(5)), CFG, str(tmp_path / "hf"))
  with pytest.raises(IncompatibleCheckpointError, match="d_model: expected 64, found 32"):
    init_params(str(tmp_path / "hf"), model_init(bigger, jax.random.key(0)), bigger)
  with pytest.raises(NoCheckpointError, match="is not a directory"):
    init_params(str(tmp_path / "absent"), None, CFG)
  os.makedirs(tmp_path / "empty")
  with pytest.raises(NoCheckpointError, match="no checkpoint in .*empty"):
    init_params(str(tmp_path / "empty"), model_init(CFG, jax.random.key(0)), CFG)
