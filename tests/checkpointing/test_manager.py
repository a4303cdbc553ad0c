"""Round trip, retention and error messages of the checkpoint manager."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm.checkpointing import (
    CheckpointConfig, CheckpointManager, IncompatibleCheckpointError,
    NoCheckpointError, StepNotFoundError)

MODEL = {"vocab_size": 16, "d_model": 8, "n_layers": 2, "remat": False}


def make_state(seed: int):
  """Params sharded over an 8-device mesh, AdamW state, a typed key, a lag buffer."""
  mesh = jax.make_mesh((8,), ("fsdp",))
  params = jax.device_put(_params(seed), {"w_DV": NamedSharding(mesh, P("fsdp")),
                                          "b_V": NamedSharding(mesh, P())})
  opt_state, lag = _opt_and_lag(params)
  return {"params": params, "opt": opt_state, "key": jax.random.key(seed + 100),
          "lag": lag}


@jax.jit
def _params(seed):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {"w_DV": jax.random.normal(k1, (8, 16)), "b_V": jax.random.normal(k2, (16,))}


@jax.jit
def _opt_and_lag(params):
  opt = optax.adamw(1e-2)
  grads = jax.tree.map(jnp.ones_like, params)
  _, opt_state = opt.update(grads, opt.init(params), params)  # non-zero moments
  return opt_state, (jax.tree.map(lambda x: x * 0.5, params),)


def assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(keys_as_data(a)), jax.tree.leaves(keys_as_data(b))):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def keys_as_data(tree):
  return jax.tree.map(
      lambda x: jax.random.key_data(x)
      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x, tree)


def test_round_trip_restores_everything_exactly(tmp_path):
  state = make_state(0)
  with CheckpointManager(str(tmp_path), CheckpointConfig(), model_config=MODEL) as m:
    m.save(7, state, data_state={"next_index": 42, "epoch": 1},
           config={"seed": 3, "method": "gspo"}, extra={"lag_steps": 1})
  m = CheckpointManager(str(tmp_path), CheckpointConfig(), model_config=MODEL)
  r = m.restore(make_state(1))  # a target with other values, same structure
  assert r.step == 7
  assert r.skipped == ()
  assert_same(r.state, state)
  assert r.data_state == {"next_index": 42, "epoch": 1}
  assert r.meta["config"] == {"seed": 3, "method": "gspo"}
  assert r.meta["extra"] == {"lag_steps": 1}
  assert r.meta["model_config"] == MODEL
  # Shardings come from the target, the key keeps its implementation.
  assert r.state["params"]["w_DV"].sharding == state["params"]["w_DV"].sharding
  assert jax.random.key_impl(r.state["key"]) == jax.random.key_impl(state["key"])
  # The restored key draws the same numbers as the saved one.
  np.testing.assert_array_equal(jax.random.uniform(r.state["key"], (3,)),
                                jax.random.uniform(state["key"], (3,)))


def test_keep_last_n_and_keep_best(tmp_path):
  cfg = CheckpointConfig(keep_last=2, keep_best=1, best_metric="eval/accuracy")
  acc = {1: 0.30, 2: 0.90, 3: 0.40, 4: 0.50, 5: 0.20}
  state = make_state(0)
  with CheckpointManager(str(tmp_path), cfg) as m:
    for step in range(1, 6):
      m.save(step, state, metrics={"eval/accuracy": acc[step], "reward": 0.0})
  m = CheckpointManager(str(tmp_path), cfg)
  # Last two (4, 5) plus the best by accuracy (2: 0.90).
  assert m.all_steps() == [2, 4, 5]
  assert sorted(int(d) for d in os.listdir(tmp_path) if d.isdigit()) == [2, 4, 5]


def test_keep_best_min_mode(tmp_path):
  cfg = CheckpointConfig(keep_last=1, keep_best=2, best_metric="loss", best_mode="min")
  loss = {1: 3.0, 2: 1.0, 3: 2.0, 4: 5.0}
  with CheckpointManager(str(tmp_path), cfg) as m:
    for step in range(1, 5):
      m.save(step, make_state(0), metrics={"loss": loss[step]})
  # Latest (4) plus the two lowest losses (2: 1.0, 3: 2.0).
  assert CheckpointManager(str(tmp_path), cfg).all_steps() == [2, 3, 4]


def test_should_save_schedule(tmp_path):
  m = CheckpointManager(str(tmp_path), CheckpointConfig(every_steps=3))
  assert [s for s in range(1, 8) if m.should_save(s)] == [3, 6]
  assert m.should_save(7, final=True)
  m.save(3, make_state(0))
  m.wait()
  assert not m.should_save(3, final=True)  # already saved (e.g. after resume)
  m.close()


def test_no_checkpoint_error_names_directory(tmp_path):
  m = CheckpointManager(str(tmp_path / "ckpt"), CheckpointConfig())
  with pytest.raises(NoCheckpointError, match=r"no checkpoint in .*ckpt"):
    m.restore(make_state(0))
  with pytest.raises(NoCheckpointError, match="no checkpoint directory"):
    CheckpointManager(str(tmp_path / "absent"), read_only=True)


def test_missing_step_error_lists_saved_steps(tmp_path):
  with CheckpointManager(str(tmp_path), CheckpointConfig()) as m:
    m.save(2, make_state(0))
    m.save(4, make_state(0))
  m = CheckpointManager(str(tmp_path), CheckpointConfig())
  with pytest.raises(StepNotFoundError, match=r"step 3 is not saved .*saved steps: \[2, 4\]"):
    m.restore(make_state(0), step=3)
  assert m.restore(make_state(1), step=2).step == 2


def test_incompatible_model_config_names_fields(tmp_path):
  with CheckpointManager(str(tmp_path), model_config=MODEL) as m:
    m.save(1, make_state(0))
  other = dict(MODEL, d_model=16, n_layers=4, remat=True)  # remat is runtime only
  m = CheckpointManager(str(tmp_path), model_config=other)
  with pytest.raises(IncompatibleCheckpointError) as e:
    m.restore(make_state(0))
  msg = str(e.value)
  assert "d_model: expected 16, found 8" in msg
  assert "n_layers: expected 4, found 2" in msg
  assert "remat" not in msg
  # Same model but remat flipped restores fine.
  assert CheckpointManager(str(tmp_path), model_config=dict(MODEL, remat=True)).restore(
      make_state(0)).step == 1


def test_incompatible_shapes_name_the_leaf(tmp_path):
  with CheckpointManager(str(tmp_path)) as m:
    m.save(1, make_state(0))
  target = make_state(0)
  target["params"]["b_V"] = jnp.zeros((32,))
  with pytest.raises(IncompatibleCheckpointError,
                     match=r"'params/b_V' has shape \(16,\) in the checkpoint, expected \(32,\)"):
    CheckpointManager(str(tmp_path)).restore(target)
  target = make_state(0)
  del target["lag"]
  with pytest.raises(IncompatibleCheckpointError, match=r"not expected: \['lag/0/b_V'"):
    CheckpointManager(str(tmp_path)).restore(target)
