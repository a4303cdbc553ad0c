"""A short fixed-seed run of each headline method raises the reward.

The reward is a verifiable property a freshly initialised model earns about
half the time (the first response character has an even code point: near
uniform first-token probabilities put about half their mass there), so the
test needs no warm start and still exercises the whole loop: sampling,
scoring, advantages, the method's loss and the updates.
"""

import json

import numpy as np
import pytest

from run_helpers import load_config, shrink
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer


def even_first_char(prompt, response, answer):
  return float(len(response) > 0 and ord(response[0]) % 2 == 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "dapo", "cispo", "icepop", "score_centering"])
def test_method_improves_reward(name, tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config(name), **{
      "train.steps": 24, "train.lr": 1e-2, "train.warmup_steps": 0, "rollout.prompts_per_step": 16,
      "seed": 1}))
  tr = Trainer(cfg, str(tmp_path), log=quiet_log, reward=RewardRunner(even_first_char))
  tr.run()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  reward = np.array([r["reward/mean"] for r in rows])
  first, last = reward[:3].mean(), reward[-3:].mean()
  # 64 samples per step: the mean of 3 steps has a standard error of at most 0.036;
  # a gain of 0.15 is over 4 of them. 24 steps: measured gains 0.25 (score_centering) to 0.45 (dapo)
  # once the first update ran at the configured lr (at 12 steps cispo and score_centering stayed at
  # 0.09 and 0.07: a fixed seed's noise around a slower climb).
  assert last > first + 0.15, (name, reward.round(3).tolist(), round(last - first, 3))
