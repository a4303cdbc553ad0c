"""dapo: the `dapo` preset of jaxrl_llm.objectives on the shared base (jaxrl_llm/training/defaults.py)."""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  c = _base("dapo")
  # DAPO's data-side changes: dynamic sampling (drop groups whose rewards are
  # all equal, refill) and the soft overlong penalty over the last 2 tokens.
  c.filters.dynamic_sampling = True
  c.filters.overlong_buffer = 2
  return c
