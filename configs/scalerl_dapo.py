"""scalerl_dapo: the `scalerl_dapo` preset of jaxrl_llm.objectives on the shared base (jaxrl_llm/training/defaults.py)."""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  return _base("scalerl_dapo")
