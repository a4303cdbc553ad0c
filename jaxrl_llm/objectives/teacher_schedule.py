"""Which weights the self-teacher uses, step by step (docs/objectives.md section 11.7).

In self-distillation (SDPO, OPSD) the teacher is the student's own network
under a privileged context, so "which weights" is a choice, and a moving
teacher changes what the gap log q - log p means. With theta_s the student's
parameters at the start of RL step s (the weights that sampled batch s, before
its update) and phi_s the teacher's parameters used to score batch s:

* ``frozen``:  phi_s = theta_0, the start of RL.
* ``current``: phi_s = theta_s, the student itself (the gap then measures only
  what the privileged context adds).
* ``refresh``: phi_s = theta_{N floor(s / N)}: held for N steps, then moved
  to the student in one jump. The student consolidates against a fixed target
  before the teacher moves (teacher-move timing, Guo et al., 2026).
* ``ema``:     phi_s = d phi_{s-1} + (1 - d) theta_s, phi_0 = theta_0.

``teacher_params_for_step`` is a pure, jittable function of the previous
teacher, the current student and the step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

KINDS = ("frozen", "current", "refresh", "ema")


@dataclasses.dataclass(frozen=True)
class TeacherSchedule:
  kind: str = "frozen"       # one of KINDS
  refresh_every: int = 10    # N in steps, used by "refresh"
  ema_decay: float = 0.99    # d in [0, 1), used by "ema"

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"teacher schedule kind={self.kind!r} is unknown; allowed: {KINDS}")
    if self.kind == "refresh" and not (isinstance(self.refresh_every, int) and self.refresh_every >= 1):
      raise ValueError(f"teacher schedule refresh_every={self.refresh_every} must be an int >= 1")
    if self.kind == "ema" and not 0.0 <= self.ema_decay < 1.0:
      raise ValueError(f"teacher schedule ema_decay={self.ema_decay} must be in [0, 1)")


def teacher_params_for_step(teacher_params, student_params, step, schedule: TeacherSchedule):
  """phi_s from phi_{s-1} (``teacher_params``), theta_s (``student_params``) and s.

  At s = 0 pass phi_{-1} = theta_0 (a copy of the initial student); every
  kind then returns theta_0. The result is detached.
  """
  if schedule.kind == "frozen":
    out = teacher_params
  elif schedule.kind == "current":
    out = student_params
  elif schedule.kind == "refresh":
    move = jnp.asarray(step) % schedule.refresh_every == 0
    out = jax.tree.map(lambda t, s: jnp.where(move, s, t).astype(t.dtype),
                       teacher_params, student_params)
  else:  # ema
    d = schedule.ema_decay
    out = jax.tree.map(lambda t, s: (d * t + (1.0 - d) * s).astype(t.dtype),
                       teacher_params, student_params)
  return jax.lax.stop_gradient(out)
