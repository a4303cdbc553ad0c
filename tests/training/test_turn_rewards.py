"""Per-turn rewards: an episode's turns are the steps of process supervision (advantage =
"grpo_process", docs/objectives.md eq. 6.10). One RL step of a two-turn environment that rewards each
turn: the batch's advantages are (6.10) of each turn's own reward, placed at its last sampled token,
and the tokens of the first turn carry the credit of both turns while those of the second carry only
its own."""

import jax
import numpy as np
import pytest

from run_helpers import make_trainer, shrink
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.objectives import process_advantages
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config
from jaxrl_llm.training.score import step_rewards
from jaxrl_llm.training.step import build_batch, rollout_and_score


class TwoTurnEnv:
  """Turn 0 earns {"progress": 1} when its text holds a digit, then an observation; turn 1 ends the
  episode and earns {"correct": 1} when its text is shorter than 3 characters."""

  name, stop_strings = "two_turns", ()

  def __init__(self, tokenizer):
    self.tok = tokenizer

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    self.turns += 1
    text = self.tok.decode(list(turn))
    if self.turns == 1:
      return Observation(({"role": "user", "content": "again"},),
                         {"progress": float(any(c.isdigit() for c in text)), "correct": 0.0}, False, "tool_result")
    return Observation((), {"progress": 0.0, "correct": float(len(text) < 3)}, True, "answer")


@pytest.fixture
def two_turn_env(monkeypatch):
  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("two_turns", lambda cfg, task, pool, tok: TwoTurnEnv(tok))


def test_grpo_process_gives_each_turn_its_own_credit(tmp_path, quiet_log, two_turn_env):
  cfg = from_config_dict(shrink(get_config("grpo"), **{
      "objective.advantage": "grpo_process", "env.name": "two_turns", "env.max_turns": 2,
      "env.max_turn_tokens": 4, "env.max_tokens": 24, "train.steps": 1}))
  tr = make_trainer(cfg, tmp_path / "run", quiet_log)
  state = tr.start_rl(tr.init_state(jax.random.key(0)))
  sb = rollout_and_score(tr.context, state, jax.random.key(1))
  batch, _ = build_batch(tr.context, state, sb)
  G = cfg.rollout.group_size
  r_BR, end_BR = step_rewards(sb.samples, sb.scores.reward_B, cfg.data.format_weight)
  assert (end_BR.sum(1) == 2).mean() > 0.5  # most episodes played both turns
  want = np.asarray(process_advantages(r_BR, end_BR, G, valid_B=sb.keep_B))
  mask = np.asarray(batch.mask_BR)
  np.testing.assert_allclose(np.asarray(batch.adv_BR), np.where(mask, want, 0.0), rtol=1e-5, atol=1e-6)
  # Per-turn credit: some episode's first-turn tokens and second-turn tokens get different advantages.
  turn = np.asarray(sb.samples.turn_BR)
  differ = [b for b in range(mask.shape[0]) if (mask[b] & (turn[b] == 0)).any() and (mask[b] & (turn[b] == 1)).any()
            and not np.isclose(want[b][mask[b] & (turn[b] == 0)][0], want[b][mask[b] & (turn[b] == 1)][-1])]
  assert differ
  state, metrics = tr.step(state)
  assert np.isfinite(metrics["loss/total"]) and metrics["grad/norm"] > 0
