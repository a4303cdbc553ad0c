"""sdpo: self-distillation with a privileged context (docs/objectives.md section 11.3).

The teacher is the student's own network shown the reference answer as a hint
before the prompt (`teacher.hint_template`); it re-scores the student's
response and the loss is the reverse KL(p || q) per token. The warm start
adds `teacher.hint_sft_steps` steps that teach the model to read a hint
(a mix of hinted, correct demonstrations and the ordinary ones). The
teacher's weights follow `teacher.schedule` (refreshed every
`teacher.refresh_every` steps: it moves only after the student consolidated).
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="sdpo")
  c.teacher.source = "self"
  c.teacher.context = "hint"
  c.teacher.hint_sft_steps = 200
  c.teacher.schedule = "refresh"
  c.teacher.refresh_every = 10
  c.teacher.signal = "distill"
  c.teacher.divergence = "reverse_kl"
  c.teacher.rl_coef = 0.0
  c.objective.aggregation = "token_mean"  # the reverse KL (docs/objectives.md eq. 11.4) summed over tokens
  return c
