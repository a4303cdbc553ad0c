"""Top-k teacher approximations: K = V is exact, bucket is a lower bound, hand cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.objectives import distill
from jaxrl_llm.objectives.distill_topk import topk_support, topk_support_gathered

B, T, V = 2, 3, 6
KINDS = ("reverse_kl", "forward_kl", "jsd")


def _pair(seed):
  zs = 1.5 * jax.random.normal(jax.random.key(seed), (B, T, V))
  zt = 1.5 * jax.random.normal(jax.random.key(seed + 100), (B, T, V))
  return jax.nn.log_softmax(zs), jax.nn.log_softmax(zt)


def _teacher_topk(lt, k):
  vals, ids = jax.lax.top_k(lt, k)
  return ids, vals


@pytest.mark.slow
@pytest.mark.parametrize("tail", ["bucket", "renormalize"])
@pytest.mark.parametrize("kind", KINDS)
def test_k_equal_vocab_is_the_full_divergence_in_value_and_gradient(tail, kind):
  ls, lt = _pair(0)
  ids, vals = _teacher_topk(lt, V)

  def approx(l):
    s, t = topk_support(l, ids, vals, tail=tail)
    return distill.token_divergence(s, t, kind=kind, beta=0.4)

  full = distill.token_divergence(ls, lt, kind=kind, beta=0.4)
  np.testing.assert_allclose(approx(ls), full, rtol=1e-5, atol=1e-6)
  # Gradients in logit space, the trainer's parameterisation (log_softmax of the logits).
  zs = ls + 0.7
  g_a = jax.grad(lambda z: jnp.sum(approx(jax.nn.log_softmax(z))))(zs)
  g_f = jax.grad(lambda z: jnp.sum(distill.token_divergence(jax.nn.log_softmax(z), lt, kind=kind,
                                                            beta=0.4)))(zs)
  np.testing.assert_allclose(g_a, g_f, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_bucket_is_a_lower_bound_for_k_below_vocab(kind):
  ls, lt = _pair(1)
  full = distill.token_divergence(ls, lt, kind=kind, beta=0.5)
  for k in (1, 3, V - 1):
    ids, vals = _teacher_topk(lt, k)
    s, t = topk_support(ls, ids, vals, tail="bucket")
    approx = distill.token_divergence(s, t, kind=kind, beta=0.5)
    assert np.all(np.asarray(approx) <= np.asarray(full) * (1 + 1e-5) + 1e-5)  # f32 rounding
    assert np.all(np.asarray(approx) >= -1e-6)
    assert np.all(np.isfinite(np.asarray(jax.grad(
        lambda l: jnp.sum(distill.token_divergence(*topk_support(l, ids, vals, tail="bucket"),
                                                   kind=kind, beta=0.5)))(ls))))


def test_hand_computed_small_cases():
  p = jnp.log(jnp.array([[[0.5, 0.3, 0.2]]]))
  q_full = jnp.array([0.6, 0.3, 0.1])
  ids = jnp.array([[[0]]])
  vals = jnp.log(q_full[:1])[None, None, :]
  s, t = topk_support(p, ids, vals, tail="bucket")
  # Buckets {0}, {1, 2}: p' = (0.5, 0.5), q' = (0.6, 0.4).
  np.testing.assert_allclose(jnp.exp(s), [[[0.5, 0.5]]], atol=1e-6)
  np.testing.assert_allclose(jnp.exp(t), [[[0.6, 0.4]]], atol=1e-6)
  # FKL = 0.6 ln(0.6/0.5) + 0.4 ln(0.4/0.5) = 0.109393 - 0.089257 = 0.020136
  fkl = 0.6 * math.log(0.6 / 0.5) + 0.4 * math.log(0.4 / 0.5)
  np.testing.assert_allclose(distill.forward_kl(s, t), [[fkl]], rtol=1e-5)
  assert abs(fkl - 0.020136) < 1e-6
  # Renormalised over ids (1, 0): p' = (0.3, 0.5) / 0.8, q' = (0.3, 0.6) / 0.9, in id order given.
  ids2 = jnp.array([[[1, 0]]])
  vals2 = jnp.log(jnp.array([[[0.3, 0.6]]]))
  s2, t2 = topk_support(p, ids2, vals2, tail="renormalize")
  np.testing.assert_allclose(jnp.exp(s2), [[[0.375, 0.625]]], atol=1e-6)
  np.testing.assert_allclose(jnp.exp(t2), [[[1 / 3, 2 / 3]]], atol=1e-6)
  # RKL = 0.375 ln(0.375 / (1/3)) + 0.625 ln(0.625 / (2/3)) = 0.044168 - 0.040337 = 0.003831
  rkl = 0.375 * math.log(0.375 * 3) + 0.625 * math.log(0.625 * 1.5)
  np.testing.assert_allclose(distill.reverse_kl(s2, t2), [[rkl]], rtol=1e-4)


def test_teacher_side_is_detached():
  ls, lt = _pair(2)
  ids, vals = _teacher_topk(lt, 3)
  g = jax.grad(lambda v: jnp.sum(distill.reverse_kl(*topk_support(ls, ids, v, tail="bucket"))))(vals)
  np.testing.assert_array_equal(g, jnp.zeros_like(vals))


def test_bad_input():
  ls, lt = _pair(3)
  ids, vals = _teacher_topk(lt, 2)
  with pytest.raises(ValueError, match="tail='none'"):
    topk_support(ls, ids, vals, tail="none")
  with pytest.raises(ValueError, match=r"outside the student's vocabulary \[0, 6\)"):
    topk_support(ls, ids + V, vals, tail="bucket")
  with pytest.raises(ValueError, match="same shape"):
    topk_support(ls, ids, vals[..., :1], tail="bucket")


@pytest.mark.slow
@pytest.mark.parametrize("tail", ["bucket", "renormalize"])
@pytest.mark.parametrize("k", [1, 3, V])
def test_gathered_support_equals_the_full_vocabulary_one(tail, k):
  """From log p at the K ids only (what a kernel gathers): same support, value and gradient."""
  ls, lt = _pair(4)
  ids, vals = _teacher_topk(lt, k)

  def full(l):
    return distill.token_divergence(*topk_support(l, ids, vals, tail=tail), kind="jsd", beta=0.3)

  def gathered(l):
    lp = jnp.take_along_axis(l, ids, axis=-1)
    return distill.token_divergence(*topk_support_gathered(lp, vals, vocab=V, tail=tail), kind="jsd", beta=0.3)

  for a, b in zip(topk_support(ls, ids, vals, tail=tail),
                  topk_support_gathered(jnp.take_along_axis(ls, ids, axis=-1), vals, vocab=V, tail=tail)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gathered(ls), full(ls), rtol=1e-5, atol=1e-6)
  g_f = jax.grad(lambda z: jnp.sum(full(jax.nn.log_softmax(z))))(ls)
  g_g = jax.grad(lambda z: jnp.sum(gathered(jax.nn.log_softmax(z))))(ls)
  np.testing.assert_allclose(g_g, g_f, rtol=1e-5, atol=1e-6)


def test_gathered_bucket_with_an_empty_student_tail_is_finite():
  # Student mass 1 on the two ids (tail 0), teacher tail 0.2: the student's bucket is empty.
  lp = jnp.log(jnp.array([[[0.25, 0.75]]]))
  lq = jnp.log(jnp.array([[[0.5, 0.3]]]))
  s, t = topk_support_gathered(lp, lq, vocab=4, tail="bucket")
  np.testing.assert_allclose(jnp.exp(s), [[[0.25, 0.75, 0.0]]], atol=1e-6)
  np.testing.assert_allclose(jnp.exp(t), [[[0.5, 0.3, 0.2]]], atol=1e-6)
  # RKL = 0.25 ln(0.25 / 0.5) + 0.75 ln(0.75 / 0.3) = -0.173287 + 0.687218 = 0.513931 (empty bucket: 0)
  np.testing.assert_allclose(distill.reverse_kl(s, t), [[0.513931]], rtol=1e-5)
  g = jax.grad(lambda l: jnp.sum(distill.reverse_kl(*topk_support_gathered(l, lq, vocab=4, tail="bucket"))))(lp)
  assert np.all(np.isfinite(np.asarray(g)))
  with pytest.raises(ValueError, match=r"k=5 must be in \[1, V=4\]"):
    topk_support_gathered(jnp.zeros((1, 5)), jnp.zeros((1, 5)), vocab=4, tail="bucket")
