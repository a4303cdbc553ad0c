"""dppo_tv: the `dppo_tv` preset of jaxrl_llm.objectives on the shared base (jaxrl_llm/training/defaults.py)."""

from jaxrl_llm.training.defaults import get_config as _base


def get_config():
  return _base("dppo_tv")
