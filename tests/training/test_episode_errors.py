"""An episode step that raises ends `play` with its own error (training/episodes.py), in every process
of a multi-process run after the round's views are shared."""

import numpy as np
import pytest
from test_episodes import LIMITS, TOK, scripted_rounds

from jaxrl_llm.envs.builtin_tools import CALCULATOR
from jaxrl_llm.envs.episode import Episode, EpisodeLimits
from jaxrl_llm.envs.pool import ToolPool
from jaxrl_llm.envs.render import PlainRenderer
from jaxrl_llm.envs.tool_env import ToolEnv
from jaxrl_llm.sampling.rollout import FINISH_EOS
from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.training import episodes as episodes_lib


@pytest.fixture(scope="module")
def pool():
  with ToolPool(2, LIMITS) as p:
    yield p


class _Broken(ToolEnv):
  """A calculator environment whose second episode's step raises."""

  def step(self, ids, *, truncated=False):
    if self.name == "broken":
      raise ValueError("the environment broke")
    return super().step(ids, truncated=truncated)


def test_an_episode_step_that_raises_ends_play_with_its_error(pool):
  """play raises the step's own exception (after the round's views are shared: in a multi-process run
  every process raises, none waits in a collective for the one that did)."""
  task = ArithmeticTask(digits=1)
  ex = Example(prompt="3+4=", answer="7")
  limits = EpisodeLimits(max_turn_tokens=16, max_context_tokens=6 + 40, max_response_tokens=40)
  envs = [_Broken(task, (CALCULATOR,), pool, call_format="tags", max_turns=3, tokenizer=TOK, instructions=False)
          for _ in range(2)]
  envs[1].name = "broken"
  episodes = [Episode(env, PlainRenderer(TOK), ex, limits) for env in envs]
  with pytest.raises(ValueError, match="the environment broke"):
    episodes_lib.play(episodes, scripted_rounds([[("7", FINISH_EOS)], [("7", FINISH_EOS)]]))


class _ScriptedSlots:
  """Continuous slots (play_slots' side of sampling/episode_slots.py) whose every turn is "7" and EOS."""

  capacity = 2

  def __init__(self):
    self.queued = []

  def submit(self, episode, context, budget, turn):
    self.queued.append(episode)

  def release(self, episode):
    pass

  def busy(self):
    return bool(self.queued)

  def advance(self, steps=()):
    from jaxrl_llm.sampling.episode_slots import EndedTurn
    ended = [EndedTurn(i, (TOK.encode("7")[0], TOK.eos_id), np.zeros((2,), np.float32), FINISH_EOS)
             for i in self.queued]
    self.queued = []
    return ended


def test_an_episode_step_that_raises_ends_play_slots_with_its_error(pool):
  """On the continuous batcher (play_slots) too, with the steps on an executor."""
  import concurrent.futures

  task = ArithmeticTask(digits=1)
  ex = Example(prompt="3+4=", answer="7")
  limits = EpisodeLimits(max_turn_tokens=16, max_context_tokens=6 + 40, max_response_tokens=40)
  envs = [_Broken(task, (CALCULATOR,), pool, call_format="tags", max_turns=3, tokenizer=TOK, instructions=False)
          for _ in range(3)]
  envs[2].name = "broken"
  episodes = [Episode(env, PlainRenderer(TOK), ex, limits) for env in envs]
  with concurrent.futures.ThreadPoolExecutor(2) as executor, pytest.raises(ValueError, match="the environment broke"):
    episodes_lib.play_slots(episodes, _ScriptedSlots(), executor)
  assert [ep.status for ep in episodes[:2]] == ["answer", "answer"]  # the others ended as scripted


def test_continuous_episodes_are_refused_in_a_run_of_several_processes(monkeypatch):
  import jax
  from run_helpers import shrink

  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.training.config import from_config_dict
  from jaxrl_llm.training.defaults import get_config

  cfg = from_config_dict(shrink(get_config("gspo"), **{"env.name": "calculator", "rollout.continuous_slots": 4}))
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ConfigError, match=r"config.rollout.continuous_slots=4 is invalid for episodes in a run of 2 "
                                        r"processes: allowed 0"):
    episodes_lib.EpisodePlayer(cfg, ArithmeticTask(digits=1), TOK)


class _SingleTurnEngine:
  """A registered rollout engine with the four methods of a single-turn run and no turn sampler; each
  one made is recorded in MADE."""

  version = -1
  MADE = []

  def __init__(self, **_):
    self.closed = False
    _SingleTurnEngine.MADE.append(self)

  def sync(self, params, version):
    pass

  def generate(self, prompts, key):
    raise AssertionError("not reached")

  def metrics(self):
    return {}

  def close(self):
    self.closed = True


def test_an_engine_without_a_turn_sampler_is_refused_for_episodes(tmp_path):
  """rollout.engine names a registered engine that cannot sample episode turns, under an environment: one
  ConfigError naming the engine and the environment, before any training; the engine is closed."""
  import jax
  from run_helpers import load_config, make_trainer, shrink

  from jaxrl_llm.checks import ConfigError
  from jaxrl_llm.sampling.engine import engine_names, register_engine
  from jaxrl_llm.training.config import from_config_dict

  if "single_turn_test" not in engine_names():
    register_engine("single_turn_test", _SingleTurnEngine)
  made = _SingleTurnEngine.MADE
  made.clear()
  cfg = from_config_dict(shrink(load_config("examples/arithmetic_calculator"),
                                **{"rollout.engine": "single_turn_test"}))
  tr = make_trainer(cfg, tmp_path, lambda s: None)
  tr.init_state(jax.random.key(0))
  with pytest.raises(ConfigError, match=r"config.rollout.engine='single_turn_test' cannot play the episodes of "
                                        r"env.name='calculator': its _SingleTurnEngine has no turn_sampler"):
    tr.rollout_engine()
  assert made and made[-1].closed and tr.engine is None
  tr.runner.close()
