"""SRPO routing (docs/objectives.md eqs. 11.10-11.12), multi-teacher routing by task tag, teacher inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.objectives import ObjectiveConfig, policy_loss
from jaxrl_llm.objectives.aggregation import WeightedSum, batch_norms
from jaxrl_llm.objectives.teacher_inputs import build_teacher_inputs, gather_predictions
from jaxrl_llm.objectives.teacher_routing import (select_teacher, srpo_branch_masks, srpo_loss,
                                                  srpo_routed_advantage, srpo_routes,
                                                  teacher_for_tasks)

CORRECT_B = jnp.array([1, 0, 0, 1])
HAS_TEACHER_B = jnp.array([1, 1, 0, 0])
MASK_BR = jnp.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=bool)
GRPO_BR = jnp.array([[1.0, 2.0, 99.0], [3.0, 4.0, 5.0], [6.0, 99.0, 99.0], [7.0, 8.0, 99.0]])
SDPO_BR = jnp.array([[0.1, 0.2, 99.0], [0.3, 0.4, 0.5], [0.6, 99.0, 99.0], [0.7, 0.8, 99.0]])


def test_srpo_routes_hand_case():
  z_grpo, z_sdpo = srpo_routes(CORRECT_B, HAS_TEACHER_B)
  # z_sdpo = (1 - c) m = (0*1, 1*1, 1*0, 0*0) = (0, 1, 0, 0)
  np.testing.assert_array_equal(z_sdpo, [0, 1, 0, 0])
  np.testing.assert_array_equal(z_grpo, [1, 0, 1, 1])


def test_srpo_routed_normalisation_hand_case():
  _, z_sdpo = srpo_routes(CORRECT_B, HAS_TEACHER_B)
  out = srpo_loss(GRPO_BR, SDPO_BR, MASK_BR, z_sdpo)
  # Row 1 (failed, has teacher) takes SDPO: 0.3 + 0.4 + 0.5 = 1.2.
  # Rows 0, 2, 3 take GRPO: (1 + 2) + 6 + (7 + 8) = 24. Tokens: 2 + 3 + 1 + 2 = 8.
  # Eq. 11.11: (24 + 1.2) / 8 = 3.15; denominator share 1 (one batch).
  np.testing.assert_allclose(out.numerator, 25.2 / 8, rtol=1e-6)
  np.testing.assert_allclose(out.denominator, 1.0)
  np.testing.assert_allclose(out.value(), 3.15, rtol=1e-6)
  # All correct: pure GRPO token mean (1+2+3+4+5+6+7+8) / 8 = 4.5.
  _, z_none = srpo_routes(jnp.ones(4, jnp.int32), HAS_TEACHER_B)
  np.testing.assert_allclose(srpo_loss(GRPO_BR, SDPO_BR, MASK_BR, z_none).value(), 4.5, rtol=1e-6)


def test_srpo_branch_masks_with_the_policy_loss_equal_the_routed_loss():
  """Eq. 11.11 via the master-equation policy loss evaluated on each branch's mask."""
  _, z_sdpo = srpo_routes(CORRECT_B, HAS_TEACHER_B)
  grpo_mask, sdpo_mask = srpo_branch_masks(MASK_BR, z_sdpo)
  np.testing.assert_array_equal(grpo_mask | sdpo_mask, MASK_BR)
  assert not bool(jnp.any(grpo_mask & sdpo_mask))
  logp_BR = -jnp.abs(jax.random.normal(jax.random.key(0), MASK_BR.shape))
  adv_B = jnp.array([1.0, -0.5, 2.0, -1.0])
  cfg = ObjectiveConfig(aggregation="token_mean")
  norms = batch_norms(MASK_BR)
  grpo_part = policy_loss(logp_BR, None, logp_BR, adv_B, grpo_mask, cfg, norms=norms).loss
  sdpo_part = WeightedSum(jnp.sum(jnp.where(sdpo_mask, SDPO_BR, 0.0)) / 8.0, jnp.float32(3 / 8))
  # On-policy REINFORCE: the per-token loss value is -A.
  per_token_grpo = -jnp.broadcast_to(adv_B[:, None], MASK_BR.shape)
  want = srpo_loss(per_token_grpo, SDPO_BR, MASK_BR, z_sdpo)
  got = grpo_part + sdpo_part
  # ~0.1 from f32 sums over the 8 real tokens of terms |A| <= 2 in two different orders: bounded by
  # ~8 * u * sum|terms| / 8 ~ 6e-7; measured <= 3e-8 over 5 seeds
  np.testing.assert_allclose(got.value(), want.value(), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got.denominator, 1.0, rtol=1e-6)


def test_srpo_routed_advantage_and_bad_input():
  _, z_sdpo = srpo_routes(CORRECT_B, HAS_TEACHER_B)
  gap_BR = jnp.full(MASK_BR.shape, -0.25)
  adv_B = jnp.array([1.0, -0.5, 2.0, -1.0])
  a = srpo_routed_advantage(adv_B, gap_BR, z_sdpo)
  np.testing.assert_allclose(a, [[1.0] * 3, [-0.25] * 3, [2.0] * 3, [-1.0] * 3])  # eq. 11.12
  with pytest.raises(ValueError, match=r"correct_B must be 0/1.*\[0, 1, 2\]"):
    srpo_routes(jnp.array([0, 1, 2, 1]), HAS_TEACHER_B)
  with pytest.raises(ValueError, match="must match"):
    srpo_loss(GRPO_BR[:, :2], SDPO_BR, MASK_BR, z_sdpo)


def test_multi_teacher_routing_by_task_tag():
  # Tags: 0 -> teacher 0, 1 -> no teacher, 2 -> teacher 1.
  idx, has = teacher_for_tasks(jnp.array([2, 0, 1, 2]), (0, -1, 1), num_teachers=2)
  np.testing.assert_array_equal(idx, [1, 0, 0, 1])
  np.testing.assert_array_equal(has, [True, True, False, True])
  per_teacher_NBT = jnp.stack([jnp.full((4, 3), 10.0), jnp.full((4, 3), 20.0)])
  np.testing.assert_array_equal(select_teacher(per_teacher_NBT, idx)[:, 0], [20, 10, 10, 20])
  with pytest.raises(ValueError, match=r"teacher_of_task\[1\]=2 is outside \[-1, 2\)"):
    teacher_for_tasks(jnp.array([0]), (0, 2), num_teachers=2)
  with pytest.raises(ValueError, match=r"tags in \[0, 5\]"):
    teacher_for_tasks(jnp.array([0, 5]), (0, 1), num_teachers=2)


def _causal_feature(inputs):
  """A causal, position-aware toy 'model': out[s] = sum_{s' <= s, real} token * (pos + 1)."""
  contrib_BS = jnp.where(inputs.mask_BS, inputs.tokens_BS * (inputs.positions_BS + 1), 0)
  return jnp.cumsum(contrib_BS, axis=1)


@pytest.mark.slow
def test_teacher_inputs_align_positions_under_any_context_padding():
  resp_BR = jnp.array([[7, 8, 9], [7, 8, 0]])
  rmask_BR = jnp.array([[1, 1, 1], [1, 1, 0]], dtype=bool)
  layouts = {
      "tight": (jnp.array([[3, 4], [3, 4]]), jnp.ones((2, 2), bool)),
      "left": (jnp.array([[0, 3, 4], [0, 3, 4]]), jnp.array([[0, 1, 1], [0, 1, 1]], bool)),
      "right": (jnp.array([[3, 4, 0, 0], [3, 4, 0, 0]]), jnp.array([[1, 1, 0, 0]] * 2, bool)),
  }
  outs = {}
  for name, (ctx, cmask) in layouts.items():
    inp = build_teacher_inputs(ctx, cmask, resp_BR, rmask_BR)
    outs[name] = gather_predictions(_causal_feature(inp), inp.predict_index_BR)
    # The slot predicting token t sees exactly context + y_<t: position of token t is 2 + t.
    resp_pos = inp.positions_BS[:, -3:]
    np.testing.assert_array_equal(resp_pos, [[2, 3, 4], [2, 3, 4]])
  # Hand value (row 0): t=0 sees context 3*1 + 4*2 = 11; t=1 adds 7*3 = 32; t=2 adds 8*4 = 64.
  np.testing.assert_array_equal(outs["tight"][0], [11, 32, 64])
  for name in ("left", "right"):
    np.testing.assert_array_equal(outs[name], outs["tight"])
  with pytest.raises(ValueError, match=r"rows \[1\] have no real context token"):
    build_teacher_inputs(jnp.array([[1], [2]]), jnp.array([[1], [0]], bool), resp_BR, rmask_BR)
