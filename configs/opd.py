"""opd: on-policy distillation from an external teacher (docs/objectives.md section 11.2).

The student samples; the teacher re-scores every sampled prefix; the loss is
the reverse KL(p || q) over the full vocabulary at each response token (mode
seeking, docs/objectives.md eq. 11.4). The default teacher is made by the warm
start: the warm-started student trained `teacher.sft_steps` more steps on
correct demonstrations only. Pure distillation (teacher.rl_coef = 0): the verifier's
reward is logged, not trained on. `--config.teacher.signal=gap_advantage`
switches to the sampled-token advantage form log q(y) - log p(y) (eq. 11.9);
`--config.teacher.source=checkpoint --config.teacher.checkpoint=DIR` uses a
saved teacher (same tokenizer).
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="opd")  # the reward branch (rl_coef > 0) is GRPO's
  c.teacher.source = "sft"
  c.teacher.signal = "distill"
  c.teacher.divergence = "reverse_kl"
  c.teacher.coef = 1.0
  c.teacher.rl_coef = 0.0
  c.objective.aggregation = "token_mean"  # eq. 11.2: one sum over all response tokens
  return c
