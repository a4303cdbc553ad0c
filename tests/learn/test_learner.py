"""The learner's step (learn/learner.py) against a step written out by hand: the full-batch
gradient of the loss's formula, then the optimizer, for every micro-batch count; the guard; the
per-row outputs, extrema and sums; a group that rides along."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.learn.learner import POLICY, Group, LearnSpec, LossOut, Slot, make_learner
from jaxrl_llm.learn.optim import adamw, warmup_schedule
from jaxrl_llm.model import sharding as sharding_lib
from jaxrl_llm.objectives.aggregation import WeightedSum

B, D, O = 32, 5, 3


def _data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, D)).astype(np.float32)
  y = rng.normal(size=(B, O)).astype(np.float32)
  w = rng.uniform(0.0, 2.0, size=B).astype(np.float32)  # uneven weights: a per-micro-batch mean would differ
  params = {"W": rng.normal(size=(D, O)).astype(np.float32) * 0.3, "b": np.zeros(O, np.float32)}
  return (x, y, w), params


def _err(params, x, y):
  return jnp.sum((x @ params["W"] + params["b"][None, :] - y) ** 2, axis=-1)


def weighted_mse(trees, mb, aux, norm):
  """sum_b w_b |x_b W + b - y_b|^2 / sum_b w_b, this micro-batch's share of it."""
  del aux
  x, y, w = mb
  err = _err(trees[POLICY], x, y)
  num = jnp.sum(w * err)
  return LossOut(objective=num / norm, loss=WeightedSum(num, jnp.sum(w)), sums={"weight": jnp.sum(w)},
                 extrema={"err_max": jnp.max(err), "err_min": jnp.min(err)}, rows={"err": err})


def _tx():
  return adamw(warmup_schedule(1e-2, 0), b1=0.9, b2=0.99, weight_decay=0.1, clip_norm=1.0)


def _learner(n_micro, params, opt_state, mesh, groups=None, loss_fn=weighted_mse):
  spec = LearnSpec(loss_fn=loss_fn, norms_fn=lambda b: jnp.sum(b[2]), groups=groups or (Group(POLICY, _tx()),),
                   n_micro=n_micro)
  rows = sharding_lib.batch_sharding(mesh, ndim=1)
  slots = {g.name: Slot(params[g.name], opt_state[g.name]) for g in spec.groups}
  frozen = {g.name: None for g in spec.groups}
  return make_learner(spec, slots, frozen, rows, rows_sharding=rows), slots, frozen


def _on_mesh(tree, mesh):
  return sharding_lib.put(jax.tree.map(jnp.asarray, tree), sharding_lib.replicated(mesh))


@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_one_step_equals_the_full_batch_step_written_out(n_micro):
  (x, y, w), params = _data()
  tx = _tx()
  # The reference: the loss's formula on the whole batch, its gradient, the optimizer.
  ref_loss, grads = jax.value_and_grad(lambda p: jnp.sum(w * _err(p, x, y)) / jnp.sum(w))(params)
  updates, ref_opt = tx.update(grads, tx.init(params), params)
  ref_params = optax.apply_updates(params, updates)

  mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices())
  p = _on_mesh(params, mesh)
  learner, slots, frozen = _learner(n_micro, {POLICY: p}, {POLICY: _on_mesh(tx.init(params), mesh)}, mesh)
  batch = sharding_lib.put((x, y, w), learner.batch_sharding)
  new, out, rows = learner.apply_with_rows(slots, frozen, batch, None)

  for k in params:
    np.testing.assert_allclose(new[POLICY].params[k], ref_params[k], rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(jax.tree.leaves(new[POLICY].opt_state)[1], jax.tree.leaves(ref_opt)[1], rtol=2e-5,
                             atol=1e-7)
  np.testing.assert_allclose(float(out.loss.value()), float(ref_loss), rtol=1e-5)
  np.testing.assert_allclose(float(out.grad_norm[POLICY]), float(optax.tree.norm(grads)), rtol=1e-5)
  assert float(out.skipped[POLICY]) == 0.0
  err = np.asarray(_err(params, x, y))
  np.testing.assert_allclose(rows["err"], err, rtol=1e-5)  # every row, in row order
  np.testing.assert_allclose(float(out.extrema["err_max"]), err.max(), rtol=1e-5)
  np.testing.assert_allclose(float(out.extrema["err_min"]), err.min(), rtol=1e-5)
  np.testing.assert_allclose(float(out.sums["weight"]), w.sum(), rtol=1e-5)
  assert learner.compiled_count() == 1  # the step is apply's program; the rows come from a forward of their own


def test_a_non_finite_loss_leaves_params_and_optimizer_state_as_they_were():
  (x, y, w), params = _data()
  x = x.copy()
  x[5, 0] = np.nan
  tx = _tx()
  mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices())
  opt = jax.tree.map(np.asarray, tx.init(params))  # host copies: the step donates the state it is given
  learner, slots, frozen = _learner(2, {POLICY: _on_mesh(params, mesh)}, {POLICY: _on_mesh(opt, mesh)}, mesh)
  new, out = learner.apply(slots, frozen, sharding_lib.put((x, y, w), learner.batch_sharding), None)
  assert float(out.skipped[POLICY]) == 1.0
  for a, b in zip(jax.tree.leaves(new[POLICY]), jax.tree.leaves(Slot(params, opt))):
    np.testing.assert_array_equal(a, b)


def test_a_group_that_does_not_update_rides_along_and_each_group_has_its_optimizer():
  (x, y, w), params = _data()
  second = {"W": params["W"] * 2.0, "b": params["b"] + 1.0}

  def two_heads(trees, mb, aux, norm):
    x, y, w = mb
    err = _err(trees[POLICY], x, y) + _err(trees["other"], x, y)
    num = jnp.sum(w * err)
    return LossOut(objective=num / norm, loss=WeightedSum(num, jnp.sum(w)))

  mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices())
  sgd = optax.sgd(0.1)
  for update in (False, True):
    groups = (Group(POLICY, _tx()), Group("other", sgd, update=update))
    opt = {POLICY: _on_mesh(_tx().init(params), mesh), "other": _on_mesh(sgd.init(second), mesh)}
    learner, slots, frozen = _learner(2, {POLICY: _on_mesh(params, mesh), "other": _on_mesh(second, mesh)}, opt,
                                      mesh, groups=groups, loss_fn=two_heads)
    new, out = learner.apply(slots, frozen, sharding_lib.put((x, y, w), learner.batch_sharding), None)
    g = jax.grad(lambda q: jnp.sum(w * (_err(params, x, y) + _err(q, x, y))) / jnp.sum(w))(second)
    want = jax.tree.map(lambda p, d: p - 0.1 * d, second, g) if update else second
    for k in second:
      np.testing.assert_allclose(new["other"].params[k], want[k], rtol=2e-5, atol=1e-6)
    assert ("other" in out.grad_norm) == update


def test_spec_refuses_no_groups_and_zero_micro_batches():
  with pytest.raises(ValueError, match="n_micro=0"):
    LearnSpec(loss_fn=weighted_mse, norms_fn=lambda b: 1.0, groups=(Group(POLICY, _tx()),), n_micro=0)
  with pytest.raises(ValueError, match="groups is empty"):
    LearnSpec(loss_fn=weighted_mse, norms_fn=lambda b: 1.0, groups=())
