"""score_centering: the `score_centering` preset of jaxrl_llm.objectives on the shared base (jaxrl_llm/training/defaults.py)."""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("score_centering")
  # Score Centering's drift term needs the sampler's next-token distribution:
  # its top-k log-probs (k = 32 matched the full sum in the paper).
  c.rollout.record_topk = 32
  return c
