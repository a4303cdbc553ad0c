"""Teacher trust knobs (docs/objectives.md): RLSD (eqs. 11.13-11.14), confidence tau (eqs. 11.16-11.17), sign gate,
schedules."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.objectives import teacher
from jaxrl_llm.objectives.teacher_schedule import TeacherSchedule, teacher_params_for_step


def test_rlsd_hand_computed_cases():
  # Rows: A = +1, +1, -2, -2, 0; one token each with gap Delta.
  adv_B = jnp.array([1.0, 1.0, -2.0, -2.0, 0.0])
  gap_BR = jnp.array([[0.5], [-0.1], [0.1], [-0.5], [0.3]])
  u = teacher.rlsd_multiplier(adv_B, gap_BR, eps_w=0.2)
  # exp(+0.5) = 1.6487 -> clipped to 1.2; exp(-0.1) = 0.904837 inside [0.8, 1.2];
  # A < 0 flips the sign: exp(-0.1) = 0.904837; exp(+0.5) -> 1.2; A = 0: exp(0) = 1.
  np.testing.assert_allclose(u[:, 0], [1.2, math.exp(-0.1), math.exp(-0.1), 1.2, 1.0], rtol=1e-6)
  a = teacher.rlsd_advantage(adv_B, gap_BR, eps_w=0.2, lam=0.5)
  # A * (0.5 + 0.5 u): 1 * 1.1; 1 * 0.952419; -2 * 0.952419; -2 * 1.1; 0.
  want = [1.1, 0.5 + 0.5 * math.exp(-0.1), -2 * (0.5 + 0.5 * math.exp(-0.1)), -2.2, 0.0]
  np.testing.assert_allclose(a[:, 0], want, rtol=1e-6)
  # lambda = 0 is GRPO; lambda = 1 is the bare multiplier.
  np.testing.assert_allclose(teacher.rlsd_advantage(adv_B, gap_BR, eps_w=0.2, lam=0.0)[:, 0], adv_B)
  np.testing.assert_allclose(teacher.rlsd_advantage(adv_B, gap_BR, eps_w=0.2, lam=1.0),
                             adv_B[:, None] * u, rtol=1e-6)


def test_rlsd_keeps_the_reward_sign_and_bounds_the_magnitude():
  adv_B = jax.random.normal(jax.random.key(0), (64,))
  gap_BR = 3.0 * jax.random.normal(jax.random.key(1), (64, 5))
  eps_w, lam = 0.3, 0.7
  a = teacher.rlsd_advantage(adv_B, gap_BR, eps_w=eps_w, lam=lam)
  adv_BR = jnp.broadcast_to(adv_B[:, None], a.shape)
  np.testing.assert_array_equal(jnp.sign(a), jnp.sign(adv_BR))
  ratio = a / adv_BR
  assert float(jnp.min(ratio)) >= 1 - lam * eps_w - 1e-6
  assert float(jnp.max(ratio)) <= 1 + lam * eps_w + 1e-6
  # Both ends of the clip are hit with such large gaps.
  assert float(jnp.min(ratio)) < 1 - lam * eps_w + 1e-5 and float(jnp.max(ratio)) > 1 + lam * eps_w - 1e-5
  # The multiplier is detached: no gradient into the gap (the teacher) or the advantage.
  g_gap, g_adv = jax.grad(lambda g, ad: jnp.sum(teacher.rlsd_advantage(ad, g, eps_w=eps_w, lam=lam)),
                          argnums=(0, 1))(gap_BR, adv_B)
  np.testing.assert_array_equal(g_gap, 0.0)
  np.testing.assert_array_equal(g_adv, 0.0)


def test_rlsd_bad_input():
  adv_B, gap_BR = jnp.ones(2), jnp.zeros((2, 3))
  with pytest.raises(ValueError, match=r"eps_w=1.0 is outside \[0, 1\)"):
    teacher.rlsd_advantage(adv_B, gap_BR, eps_w=1.0, lam=0.5)
  with pytest.raises(ValueError, match=r"lam=1.5 is outside \[0, 1\]"):
    teacher.rlsd_advantage(adv_B, gap_BR, eps_w=0.2, lam=1.5)
  with pytest.raises(ValueError, match=r"adv has shape \(3,\)"):
    teacher.rlsd_advantage(jnp.ones(3), gap_BR, eps_w=0.2, lam=0.5)


def test_teacher_entropy_and_confidence_weight():
  logq = jnp.log(jnp.array([[[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]]]))
  h = teacher.teacher_entropy(logq)
  np.testing.assert_allclose(h, [[math.log(4), 0.0]], atol=1e-6)  # uniform: ln 4; one-hot: 0
  tau = teacher.confidence_weight(h, beta=1.0, tau_min=0.3, tau_max=0.9)
  # exp(-ln 4) = 0.25 -> clipped up to 0.3; exp(0) = 1 -> clipped down to 0.9.
  np.testing.assert_allclose(tau, [[0.3, 0.9]], rtol=1e-6)
  tau2 = teacher.confidence_weight(h, beta=0.5, tau_min=0.0, tau_max=1.0)
  np.testing.assert_allclose(tau2, [[0.5, 1.0]], rtol=1e-6)  # exp(-0.5 ln 4) = 1/2
  g = jax.grad(lambda l: jnp.sum(teacher.confidence_weight(teacher.teacher_entropy(l), beta=1.0,
                                                           tau_min=0.0, tau_max=1.0)))(logq)
  np.testing.assert_array_equal(g, 0.0)
  with pytest.raises(ValueError, match="tau_min=0.8, tau_max=0.5"):
    teacher.confidence_weight(h, beta=1.0, tau_min=0.8, tau_max=0.5)
  with pytest.raises(ValueError, match="beta=-1"):
    teacher.confidence_weight(h, beta=-1.0, tau_min=0.0, tau_max=1.0)


def test_sign_gate_hand_cases():
  gap_BR = jnp.array([[0.4, -0.2, 0.0], [0.4, -0.2, 0.1], [0.3, -0.3, 0.2]])
  adv_B = jnp.array([1.0, -1.0, 0.0])
  np.testing.assert_array_equal(teacher.sign_gate(gap_BR, adv_B),
                                [[1, 0, 0], [0, 1, 0], [0, 0, 0]])
  np.testing.assert_allclose(teacher.sign_gate(gap_BR, adv_B, disagree_weight=0.25),
                             [[1, 0.25, 0.25], [0.25, 1, 0.25], [0.25, 0.25, 0.25]])
  with pytest.raises(ValueError, match="disagree_weight=2"):
    teacher.sign_gate(gap_BR, adv_B, disagree_weight=2.0)


def _run_schedule(schedule, steps=7, jit=False):
  """Student theta_s = s (a scalar leaf and a vector leaf); returns phi_s per step."""
  fn = teacher_params_for_step
  if jit:
    fn = jax.jit(fn, static_argnums=3)
  phi = {"w": jnp.float32(0.0), "v": jnp.zeros(2)}  # phi_{-1} = theta_0
  out = []
  for s in range(steps):
    theta = {"w": jnp.float32(s), "v": jnp.full(2, float(s))}
    phi = fn(phi, theta, jnp.int32(s), schedule)
    out.append(float(phi["w"]))
    np.testing.assert_allclose(phi["v"], [phi["w"]] * 2)
  return out


@pytest.mark.parametrize("jit", [False, True])
def test_teacher_schedules_follow_the_timing_rules(jit):
  assert _run_schedule(TeacherSchedule("frozen"), jit=jit) == [0.0] * 7
  assert _run_schedule(TeacherSchedule("current"), jit=jit) == [0, 1, 2, 3, 4, 5, 6]
  # refresh every 3: theta_{3 floor(s / 3)}
  assert _run_schedule(TeacherSchedule("refresh", refresh_every=3), jit=jit) == [0, 0, 0, 3, 3, 3, 6]
  # ema d = 0.5: phi_s = 0.5 phi_{s-1} + 0.5 s: 0, 0.5, 1.25, 2.125, 3.0625
  got = _run_schedule(TeacherSchedule("ema", ema_decay=0.5), steps=5, jit=jit)
  np.testing.assert_allclose(got, [0.0, 0.5, 1.25, 2.125, 3.0625])


def test_teacher_schedule_bad_input():
  with pytest.raises(ValueError, match="kind='moving'"):
    TeacherSchedule("moving")
  with pytest.raises(ValueError, match="refresh_every=0"):
    TeacherSchedule("refresh", refresh_every=0)
  with pytest.raises(ValueError, match="ema_decay=1.0"):
    TeacherSchedule("ema", ema_decay=1.0)
