"""srpo: route each sample to GRPO or to SDPO (docs/objectives.md section 11.4, eqs. 11.10-11.11).

z_sdpo = (1 - c_i) m_i: failed samples with teacher information take the
self-distillation loss (the SDPO self-teacher of configs/sdpo.py), every other
sample takes GRPO's; both branches share one token normaliser
(objective.aggregation = token_mean, eq. 11.11).
"""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("grpo", name="srpo")
  c.teacher.source = "self"
  c.teacher.context = "hint"
  c.teacher.hint_sft_steps = 200
  c.teacher.schedule = "refresh"
  c.teacher.refresh_every = 10
  c.teacher.signal = "srpo"
  c.teacher.divergence = "reverse_kl"
  c.objective.aggregation = "token_mean"  # eq. 11.11's shared denominator
  return c
