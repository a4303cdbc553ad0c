"""Every config in configs/ runs 3 RL steps (tiny model, tiny batch), in one
process so the sampler and recompute compilations are shared."""

import json
import math
import os

import pytest

from run_helpers import CONFIGS, load_config, shrink
from jaxrl_llm.tasks.rewards import RewardRunner
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.loop import Trainer

def _parity_reward(prompt, response, answer):
  """A reward a random model earns half the time: groups get real advantages."""
  return float(len(response) % 2)


# reward_model.py, process_reward_model.py and dpo.py configure `python -m jaxrl_llm.reward_model`
# (tests/reward_model/, tests/objectives/test_dpo.py), not an RL method; rlhf_arithmetic.py and
# rlhf_process.py need such a run's workdir first (tests/reward_model/test_rm_reward.py and
# test_process_rm.py run them).
NAMES = sorted(f[:-3] for f in os.listdir(CONFIGS)
               if f.endswith(".py") and f not in ("base.py", "reward_model.py", "rlhf_arithmetic.py",
                                                  "process_reward_model.py", "rlhf_process.py", "dpo.py"))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_config_runs_three_steps(name, tmp_path, quiet_log):
  cfg = from_config_dict(shrink(load_config(name)))
  tr = Trainer(cfg, str(tmp_path), log=quiet_log, reward=RewardRunner(_parity_reward))
  summary = tr.run()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    assert isinstance(r["loss/total"], float) and math.isfinite(r["loss/total"]), r["loss/total"]
    assert r["update/skipped_nonfinite"] == 0.0
    assert r["update/count"] == cfg.train.epochs * cfg.train.mini_batches
    assert r["grad/norm"] > 0.0  # a real update reached the weights
  assert summary["rl_steps"] == 3 and 0.0 <= summary["eval_accuracy_end"] <= 1.0
