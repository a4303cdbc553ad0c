"""rlsd: reward direction, teacher magnitude (docs/objectives.md section 11.5, eqs. 11.13-11.14).

A_it = A_i [(1 - lambda) + lambda u_it], u = clip(exp(sign(A_i) Delta_it),
1 - eps_w, 1 + eps_w), Delta the detached gap log q(y) - log p(y). The verifier
decides the sign; the teacher (the self-teacher with the answer as a hint,
as in configs/sdpo.py) only scales tokens inside it. The policy loss is GRPO's.
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="rlsd")
  c.teacher.source = "self"
  c.teacher.context = "hint"
  c.teacher.hint_sft_steps = 200
  c.teacher.schedule = "refresh"
  c.teacher.refresh_every = 10
  c.teacher.signal = "rlsd"
  c.teacher.eps_w = 0.2
  c.teacher.lam = 1.0
  return c
