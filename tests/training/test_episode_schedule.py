"""Episodes on the continuous batcher (training/episodes.play_slots with sampling/episode_slots.py) are
the same run after run: the schedule depends on the turns alone, not on how long an environment
takes to step, so a batch played twice with the same key, under steps that sleep a random time, gives
the same rows bit for bit (what a resumed run needs to replay its step exactly)."""

import random
import threading
import time

import jax
import numpy as np
import pytest

from run_helpers import shrink
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.model import ModelConfig, init_params
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.sampling.config import SamplingConfig
from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.training import episodes as episodes_lib
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config

TOK = CharTokenizer()
_JITTER = random.Random(0)
_LOCK = threading.Lock()


class SlowEnv:
  """Up to three turns; each step sleeps 0-40 ms (another time at every call), then answers with the
  turn's length; a turn whose ids sum to an odd number ends the episode early."""

  name, stop_strings = "slow", ()

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    with _LOCK:
      pause = _JITTER.uniform(0.0, 0.04)
    time.sleep(pause)
    self.turns += 1
    if self.turns < 3 and sum(turn) % 2 == 0:
      return Observation(({"role": "tool", "content": f"<{len(turn)}>"},), {"correct": 0.0}, False, "tool_result")
    return Observation((), {"correct": 1.0}, True, "answer")


@pytest.mark.slow
def test_slots_play_the_same_episodes_whatever_the_steps_take(monkeypatch):
  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("slow", lambda cfg, task, pool, tok: SlowEnv())
  model_cfg = ModelConfig.tiny(TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                               d_ff=64, init_std=0.3)
  params = init_params(model_cfg, jax.random.key(0))
  task = ArithmeticTask(digits=1)
  examples = task.examples("train", 10)
  sampling = SamplingConfig(temperature=1.0, max_new_tokens=6, pad_id=TOK.pad_id, eos_ids=(TOK.eos_id,))
  cfg = from_config_dict(shrink(get_config("gspo"), **{
      "env.name": "slow", "env.max_turns": 3, "env.max_turn_tokens": 6, "env.max_tokens": 48, "env.workers": 4,
      "data.max_prompt_len": 8, "rollout.continuous_slots": 4, "rollout.decode_chunk": 2}))
  player = episodes_lib.EpisodePlayer(cfg, task, TOK)
  try:
    a, b = (player.play(params, model_cfg, examples, sampling, jax.random.key(2)) for _ in range(2))
  finally:
    player.close()
  for name in ("tokens_BR", "mask_BR", "context_BR", "turn_BR", "behav_logp_BR"):
    np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)
  assert a.statuses == b.statuses
  turns = (np.where(a.mask_BR, a.turn_BR, -1).max(axis=1) + 1).tolist()
  assert len(set(turns)) >= 2, turns  # episodes of different lengths: slots were freed and taken at different times
