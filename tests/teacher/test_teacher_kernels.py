"""The teacher through the vocabulary kernels: the signals and the loss term equal
full-vocabulary references built from plain logits, in value and in gradient, for
every divergence, kernels.impl, top-k tail, and with one teacher per task tag."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from teacher_helpers import (
  CFG,
  P_LEN,
  TOK,
  StepState,
  loss_context,
  make_samples,
  student_full_logp,
  teacher_full_logq,
  tiny_params,
)

from jaxrl_llm import model as model_lib
from jaxrl_llm.objectives import distill
from jaxrl_llm.objectives import teacher as teacher_w
from jaxrl_llm.objectives.distill_topk import topk_support
from jaxrl_llm import teacher as tlib

IMPLS = ("naive", "xla_chunked")
TEMP = 0.8  # != 1: both sides are tempered


def _stage(cfg, teacher_params, impl, teacher_cfg=CFG, **kw):
  return tlib.TeacherStage(cfg, teacher_params, teacher_cfg, CFG, TOK, temperature=TEMP, max_prompt_len=P_LEN,
                           impl=impl, **kw)


def _take(logp_BRV, tokens_BR):
  return np.take_along_axis(np.asarray(logp_BRV), tokens_BR[..., None].astype(np.int64), axis=-1)[..., 0]


def _assert_trees_close(a, b, **tol):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, err_msg=jax.tree_util.keystr(path), **tol)


def _assert_value_and_grad_close(loss, ref, params):
  """Value (rtol 1e-5, atol 5e-6) and gradient (rtol 2e-4) equal the reference's, jitted."""
  (v, g), (v_ref, g_ref) = jax.jit(jax.value_and_grad(loss))(params), jax.jit(jax.value_and_grad(ref))(params)
  assert float(v_ref) > 1e-4  # a real gap between the two random models
  # atol: the bucket's 1 - sum_k p_k rounding, and each token's divergence is a difference of sums ~log V
  # = 4.6 over V in other orders: in practice a few ulps of 4.6 (4.8e-7), asserted at ~10 (V u sum|terms|
  # ~ 5e-5 is the worst case); measured <= 1.3e-7 over 4 seeds
  np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=5e-6)
  _assert_trees_close(g, g_ref, rtol=2e-4, atol=1e-6)


def _term_and_reference(stage, s, extra, ref_div_BR, coef):
  """(term loss fn, reference loss fn) of the student's params; token_mean over the real tokens."""
  (_, term), = stage.extra_terms("token_mean")
  aux = stage.heads(StepState(None, 0))
  m = jnp.asarray(s.mask_BR)

  def loss(params):
    return term(loss_context(params, CFG, s, extra, aux)).value()

  def ref(params):
    return coef * jnp.sum(jnp.where(m, ref_div_BR(student_full_logp(params, CFG, s, TEMP)), 0.0)) / m.sum()

  return loss, ref


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_signals_equal_the_full_vocabulary_reference(impl):
  s = make_samples()
  teacher, student = tiny_params(3), tiny_params(4)
  stage = _stage(tlib.TeacherConfig(source="sft", signal="gap_advantage"), teacher, impl)
  sig = stage.signals(s, student, step=0)
  logq, logp = teacher_full_logq(stage, teacher, s), np.asarray(student_full_logp(student, CFG, s, TEMP))
  m = s.mask_BR
  on = lambda a: np.where(m, a, 0.0)
  np.testing.assert_allclose(sig.teacher_logp_BR, on(_take(logq, s.tokens_BR)), atol=2e-5)
  np.testing.assert_allclose(sig.student_logp_BR, on(_take(logp, s.tokens_BR)), atol=2e-5)
  np.testing.assert_allclose(sig.gap_BR, on(_take(logq, s.tokens_BR) - _take(logp, s.tokens_BR)), atol=4e-5)
  np.testing.assert_allclose(sig.teacher_entropy_BR, on(teacher_w.teacher_entropy(logq)), atol=2e-5)
  np.testing.assert_allclose(sig.kl_BR, on(distill.reverse_kl(logp, logq)), atol=2e-5)
  assert sig.loss_inputs == {}  # the advantage form needs nothing beyond [B, R]


# xla_chunked streams KL(p||q), KL(q||p) and JSD at beta = 1; JSD at 0.3 takes the full-vocabulary path.
@pytest.mark.parametrize("impl,divergence,beta", [
    ("xla_chunked", "reverse_kl", 0.5), ("xla_chunked", "forward_kl", 0.5), ("xla_chunked", "jsd", 0.3),
    ("xla_chunked", "jsd", 1.0), ("naive", "reverse_kl", 0.5), ("naive", "jsd", 0.3)])
@pytest.mark.slow
def test_distill_term_is_the_spec_divergence_in_value_and_gradient(impl, divergence, beta):
  s = make_samples()
  teacher, student = tiny_params(5), tiny_params(6)
  cfg = tlib.TeacherConfig(source="sft", divergence=divergence, jsd_beta=beta, coef=1.5)
  stage = _stage(cfg, teacher, impl)
  sig = stage.signals(s, student, step=0)
  _, extra, _ = stage.apply(sig, np.zeros(s.mask_BR.shape, np.float32), s.mask_BR, np.zeros(3))
  assert extra["teacher_hidden_BRD"].shape == (3, s.tokens_BR.shape[1], CFG.d_model)  # no V axis
  logq = teacher_full_logq(stage, teacher, s)
  loss, ref = _term_and_reference(
      stage, s, extra, lambda logp: distill.token_divergence(logp, logq, kind=divergence, beta=beta), 1.5)
  _assert_value_and_grad_close(loss, ref, student)


@pytest.mark.parametrize("impl,tail,divergence", [
    ("xla_chunked", "renormalize", "reverse_kl"), ("xla_chunked", "bucket", "reverse_kl"),
    ("xla_chunked", "bucket", "jsd"), ("naive", "renormalize", "jsd"), ("naive", "bucket", "reverse_kl")])
@pytest.mark.slow
def test_topk_term_is_distill_topk_on_the_teachers_topk(impl, tail, divergence):
  k = 5
  s = make_samples()
  teacher, student = tiny_params(7), tiny_params(8)
  cfg = tlib.TeacherConfig(source="sft", divergence=divergence, jsd_beta=0.4, topk=k, topk_tail=tail)
  stage = _stage(cfg, teacher, impl)
  sig = stage.signals(s, student, step=0)
  _, extra, _ = stage.apply(sig, np.zeros(s.mask_BR.shape, np.float32), s.mask_BR, np.zeros(3))
  assert set(extra) == {"teacher_weight_BR", "teacher_topk_ids_BRK", "teacher_topk_logp_BRK"}
  logq = teacher_full_logq(stage, teacher, s)
  vals, ids = jax.lax.top_k(jnp.asarray(logq), k)
  m = s.mask_BR
  np.testing.assert_array_equal(extra["teacher_topk_ids_BRK"][m], np.asarray(ids)[m])
  np.testing.assert_allclose(extra["teacher_topk_logp_BRK"][m], np.asarray(vals)[m], atol=2e-5)

  def ref_div(logp):
    return distill.token_divergence(*topk_support(logp, ids, vals, tail=tail), kind=divergence, beta=0.4)

  loss, ref = _term_and_reference(stage, s, extra, ref_div, 1.0)
  _assert_value_and_grad_close(loss, ref, student)


@pytest.mark.slow
def test_route_by_tag_scores_each_row_with_its_teacher():
  """Tags a -> teacher 0, b -> teacher 1 (a wider model), c -> none (m_i = 0)."""
  wide = dataclasses.replace(CFG, d_model=48, head_dim=24)
  s = make_samples(tags=("a", "b", "c"))
  t0, t1, student = tiny_params(9), model_lib.init_params(wide, jax.random.key(10)), tiny_params(11)
  cfg = tlib.TeacherConfig(source="checkpoint", route_by_tag="a=/t0,b=/t1", signal="distill")
  stage = _stage(cfg, (t0, t1), "xla_chunked", teacher_cfg=(CFG, wide), tag_teacher={"a": 0, "b": 1})
  sig = stage.signals(s, student, step=0)
  np.testing.assert_array_equal(sig.has_teacher_B, [True, True, False])
  logp = np.asarray(student_full_logp(student, CFG, s, TEMP))
  logq_0 = teacher_full_logq(stage, t0, s, n=0)
  logq_1 = teacher_full_logq(stage, t1, s, n=1)
  kl_0, kl_1 = np.asarray(distill.reverse_kl(logp, logq_0)), np.asarray(distill.reverse_kl(logp, logq_1))
  m = s.mask_BR
  np.testing.assert_allclose(sig.kl_BR[0], np.where(m[0], kl_0[0], 0.0), atol=2e-5)
  np.testing.assert_allclose(sig.kl_BR[1], np.where(m[1], kl_1[1], 0.0), atol=2e-5)
  np.testing.assert_array_equal(sig.kl_BR[2], 0.0)
  np.testing.assert_array_equal(sig.gap_BR[2], 0.0)
  _, extra, metrics = stage.apply(sig, np.zeros(m.shape, np.float32), m, np.zeros(3))
  np.testing.assert_array_equal(extra["teacher_index_BR"][:, 0], [0, 1, 0])
  np.testing.assert_array_equal(extra["teacher_weight_BR"][2], 0.0)  # no teacher for tag c
  assert extra["teacher_hidden_BRD"].shape[-1] == 48  # teacher 0's 32 columns are zero-padded
  assert metrics["teacher/has_teacher_frac"] == pytest.approx(2 / 3)
  # The loss: rows 0 and 1 against their own teacher; row 2's tokens count in the denominator only.
  (_, term), = stage.extra_terms("token_mean")
  ws = term(loss_context(student, CFG, s, extra, stage.heads(StepState(student, 0))))
  want = (kl_0[0][m[0]].sum() + kl_1[1][m[1]].sum()) / m.sum()
  # ~0.015 from differences of sums ~log V in other orders: ~10 ulps of 4.6 (as in
  # _assert_value_and_grad_close); measured <= 1.3e-7 over 4 seeds (0.8 of rtol=1e-5 alone)
  np.testing.assert_allclose(ws.value(), want, rtol=1e-5, atol=5e-6)
