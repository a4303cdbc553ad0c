"""A reward model from pairwise preferences: the built-in arithmetic pairs (correct answer over a
wrong one) on the tiny model, about a minute on 2 CPU cores.

    python -m jaxrl_llm.reward_model --config=configs/reward_model.py [--config.data.label_noise=0.2]
    python -m jaxrl_llm.reward_model --config=configs/reward_model.py --config.data.path=prefs.jsonl

Keys and their meaning: jaxrl_llm/reward_model/defaults.py.
"""

from jaxrl_llm.reward_model.defaults import reward_model_config


def get_config():
  return reward_model_config()
