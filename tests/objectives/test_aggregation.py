"""Aggregation modes (lambda) and exact micro-batching."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives_reference as ref
from jaxrl_llm.objectives import (AGGREGATIONS, WeightedSum, aggregate, batch_norms, get_preset, policy_loss)

NAN = float("nan")
# B = 4, T = 3, G = 2; padding holds NaN, which must never leak.
MASK = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]], bool)
LOSS = jnp.array([[1.0, 2.0, 3.0], [4.0, NAN, NAN], [NAN, NAN, NAN], [5.0, 6.0, NAN]])


@pytest.mark.parametrize("mode,want", [
    ("token_mean", 21 / 6),  # (1+2+3+4+5+6) / 6 tokens
    ("seq_mean_token_mean", (2 + 4 + 5.5) / 3),  # per-answer means 6/3, 4/1, 11/2 over 3 answers
    ("seq_mean_token_sum", 21 / 3),  # answer sums over 3 non-empty answers (row 2 is padding)
    ("constant", 21 / (3 * 4)),  # Dr. GRPO: B_seq * L_max with L_max = 4
    ("group_token_mean", (10 / 4 + 11 / 2) / 2),  # groups {0,1}: 10 over 4 tokens; {2,3}: 11 over 2
])
def test_golden_values(mode, want):
  norms = batch_norms(MASK, 2, max_len=4)
  out = aggregate(LOSS, MASK, mode, norms)
  assert float(out.value()) == pytest.approx(want, rel=1e-6)
  assert float(out.denominator) == pytest.approx(1.0)  # whole batch: share 1


def test_weighted_sum_total_and_empty():
  a, b = WeightedSum(jnp.float32(3.0), jnp.float32(2.0)), WeightedSum(jnp.float32(1.0), jnp.float32(2.0))
  assert float(WeightedSum.total([a, b]).value()) == pytest.approx(1.0)  # (3 + 1) / (2 + 2)
  assert float(WeightedSum(jnp.float32(0.0), jnp.float32(0.0)).value()) == 0.0
  with pytest.raises(ValueError, match="at least one"):
    WeightedSum.total([])


def _per_token_loss(x_BR, adv_BR):
  return -adv_BR * x_BR + 0.5 * jnp.square(x_BR)


@pytest.mark.slow
@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batches_are_exact(mode):
  """Sum of micro-batch numerators == full loss; sum of their grads == full grad."""
  b = ref.make_batch(4)
  mask = b["mask"]
  x = jax.random.normal(jax.random.key(5), mask.shape)
  norms = batch_norms(mask, ref.G, max_len=7)

  def full(xx):
    return aggregate(_per_token_loss(xx, b["adv"]), mask, mode, norms).value()

  parts, grads = [], []
  for lo, hi in ((0, 3), (3, 6)):  # group-aligned micro-batches (G = 3)
    def num(xs, lo=lo, hi=hi):
      return aggregate(_per_token_loss(xs, b["adv"][lo:hi]), mask[lo:hi], mode, norms).numerator
    parts.append(aggregate(_per_token_loss(x[lo:hi], b["adv"][lo:hi]), mask[lo:hi], mode, norms))
    grads.append(jax.grad(num)(x[lo:hi]))
  total = WeightedSum.total(parts)
  assert float(total.denominator) == pytest.approx(1.0)
  assert float(total.value()) == pytest.approx(float(full(x)), rel=1e-6)
  lam = ref.ref_lambda(np.asarray(mask), mode, max_len=7)
  want = np.sum(lam * np.asarray(_per_token_loss(x, b["adv"])))
  assert float(full(x)) == pytest.approx(want, rel=1e-5)
  np.testing.assert_allclose(np.concatenate(grads), np.asarray(jax.grad(full)(x)), rtol=1e-6, atol=1e-8)


@functools.partial(jax.jit, static_argnums=(0,))
def _loss_and_grad(cfg, logp, prox, behav, adv, mask, norms):
  def f(lp):
    out = policy_loss(lp, prox, behav, adv, mask, cfg, norms=norms)
    return out.loss.numerator, out
  return jax.grad(f, has_aux=True)(logp)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", [("seq_tis", "seq_mean_token_mean"), ("gspo", "group_token_mean")])
def test_policy_loss_micro_batches_are_exact(name, mode):
  """The full policy loss (sequence-level weights included) accumulates exactly."""
  b = ref.make_batch(6)
  cfg = get_preset(name, aggregation=mode)
  lp_full = jax.nn.log_softmax(b["z"])
  y = b["y"][..., None]
  logp, prox, behav = (jnp.take_along_axis(jax.nn.log_softmax(z), y, -1)[..., 0]
                       for z in (b["z"], b["z_prox"], b["z_behav"]))
  del lp_full
  norms = batch_norms(b["mask"], ref.G, cfg)
  g_full, out_full = _loss_and_grad(cfg, logp, prox, behav, b["adv"], b["mask"], norms)
  pieces = [_loss_and_grad(cfg, logp[s], prox[s], behav[s], b["adv"][s], b["mask"][s], norms)
            for s in (slice(0, 3), slice(3, 6))]
  total = WeightedSum.total([p[1].loss for p in pieces])
  assert float(total.value()) == pytest.approx(float(out_full.loss.value()), rel=1e-6, abs=1e-7)
  np.testing.assert_allclose(np.concatenate([p[0] for p in pieces]), np.asarray(g_full), rtol=1e-6, atol=1e-8)
  # Diagnostics accumulate too: token fractions are additive.
  frac = WeightedSum.total([p[1].metrics["trust/clip_high_frac"] for p in pieces])
  assert float(frac.value()) == pytest.approx(float(out_full.metrics["trust/clip_high_frac"].value()))


def test_group_mode_needs_whole_groups():
  norms = batch_norms(MASK, 2)
  with pytest.raises(ValueError, match="group_size=2 does not divide the micro-batch rows"):
    aggregate(LOSS[:3], MASK[:3], "group_token_mean", norms)


def test_batch_norms_errors():
  with pytest.raises(ValueError, match="group_size=3 does not divide"):
    batch_norms(MASK, 3)
  with pytest.raises(ValueError, match="max_len=0"):
    batch_norms(MASK, 2, max_len=0)
  with pytest.raises(ValueError, match="aggregation='mean'"):
    aggregate(LOSS, MASK, "mean")


@pytest.mark.slow
def test_sharded_batch_equals_single_device():
  """Under jit with the batch sharded over the fake 8-device mesh, loss and grad are unchanged."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  cfg = get_preset("seq_mis", aggregation="seq_mean_token_mean")
  k = jax.random.split(jax.random.key(11), 4)
  shape = (8, 4)
  logp = -jax.random.uniform(k[0], shape, minval=0.1, maxval=3.0)
  prox = logp + 0.3 * jax.random.normal(k[1], shape)
  behav = prox + 0.3 * jax.random.normal(k[2], shape)
  adv = jax.random.normal(k[3], (8,))
  mask = jnp.arange(4)[None, :] < jnp.array([4, 3, 1, 0, 2, 4, 4, 1])[:, None]
  norms = batch_norms(mask, 1, cfg)
  g_ref, out_ref = _loss_and_grad(cfg, logp, prox, behav, adv, mask, norms)
  mesh = jax.make_mesh((8,), ("data",))
  row = NamedSharding(mesh, P("data"))
  put = lambda x: jax.device_put(x, row)  # noqa: E731
  g_sh, out_sh = _loss_and_grad(cfg, put(logp), put(prox), put(behav), put(adv), put(mask), norms)
  assert float(out_sh.loss.value()) == pytest.approx(float(out_ref.loss.value()), rel=1e-6)
  np.testing.assert_allclose(np.asarray(g_sh), np.asarray(g_ref), rtol=1e-6, atol=1e-8)
