"""How an episode ends and what its limits count (docs/objectives.md section 6): a last turn spent on a
tool call did not finish, the soft overlong penalty counts policy tokens against the policy's room, and
the tool examples' turn limits can be reached."""

import base64
import json
import os

import numpy as np
import pytest

from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.envs.builtin_tools import CALCULATOR
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.episode import Episode, EpisodeLimits, run_episode
from jaxrl_llm.envs.pool import ToolLimits, ToolPool
from jaxrl_llm.envs.render import PlainRenderer
from jaxrl_llm.envs.tool_env import TRUNCATED, ToolEnv
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.rundir import inspect_page, token_dump
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.sampling.turns import SampledTurns
from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.tasks.countdown import CountdownTask
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.training import episodes as episodes_lib
from jaxrl_llm.training import provenance
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config
from jaxrl_llm.training.score import FilterConfig, episode_rewards, overlong_keep, policy_budget, score

TOK = CharTokenizer()
from test_episodes import LIMITS, TOK, scripted_rounds


@pytest.fixture(scope="module")
def pool():
  with ToolPool(2, LIMITS) as p:
    yield p


def test_an_episode_that_ends_on_a_tool_call_did_not_finish(pool):
  """The last allowed turn spent on a call (turn_limit) leaves the episode unfinished, as a cut turn
  does: it is truncated, so the overlong filter takes it out of the loss."""
  ex = Example(prompt="3+4=", answer="7")
  limits = EpisodeLimits(max_turn_tokens=16, max_context_tokens=6 + 80, max_response_tokens=80)
  episodes = [Episode(ToolEnv(ArithmeticTask(digits=1), (CALCULATOR,), pool, call_format="tags", max_turns=2,
                              tokenizer=TOK, instructions=False), PlainRenderer(TOK), ex, limits) for _ in range(2)]
  script = [[("<calc>3+4</calc>", FINISH_STOP), ("<calc>4+3</calc>", FINISH_STOP)],
            [("<calc>3+4</calc>", FINISH_STOP), ("7", FINISH_EOS)]]
  batch = episodes_lib.episode_batch(episodes_lib.play(episodes, scripted_rounds(script)), [ex] * 2,
                                     prompt_len=8, response_len=80, tokenizer=TOK)
  assert batch.statuses == ("turn_limit", "answer")
  assert batch.truncated_B.tolist() == [True, False]
  assert overlong_keep(batch.truncated_B, True).tolist() == [False, True]
  assert set(episodes_lib.UNFINISHED) == {"token_limit", "context_overflow", "turn_limit"}


def test_soft_overlong_penalty_counts_policy_tokens_against_the_policys_room(pool):
  """An episode's policy had room for env.max_tokens less the environment's tokens of its row; DAPO's
  penalty (eq. 13) measures its sampled tokens against that, so a row that filled its room gets the
  whole penalty."""
  ex = Example(prompt="3+4=", answer="7")
  R, buffer = 40, 8
  limits = EpisodeLimits(max_turn_tokens=16, max_context_tokens=6 + R, max_response_tokens=R)
  episodes = [Episode(ToolEnv(ArithmeticTask(digits=1), (CALCULATOR,), pool, call_format="tags", max_turns=3,
                              tokenizer=TOK, instructions=False), PlainRenderer(TOK), ex, limits) for _ in range(3)]
  # Row 0: a call (16), its result (18), then a turn cut by the 40 - 34 = 6 tokens left (context_overflow).
  # Row 1: a call, its result, "7<eos>" (2). Row 2: "8<eos>" at once.
  script = [[("<calc>3+4</calc>", FINISH_STOP), ("7" * 16, FINISH_LENGTH)],
            [("<calc>3+4</calc>", FINISH_STOP), ("7", FINISH_EOS)],
            [("8", FINISH_EOS)]]
  batch = episodes_lib.episode_batch(episodes_lib.play(episodes, scripted_rounds(script)), [ex] * 3,
                                     prompt_len=8, response_len=R, tokenizer=TOK)
  assert batch.statuses == ("context_overflow", "answer", "answer")
  policy_B, env_B = batch.length_B, (batch.context_BR & ~batch.mask_BR).sum(axis=1)
  assert policy_B.tolist() == [22, 18, 2] and env_B.tolist() == [18, 18, 0]
  np.testing.assert_array_equal(policy_budget(batch, R), [22, 22, 40])
  # -p * clip(L - (room - buffer), 0, buffer) / buffer, room = R - env: row 0 22 - 14 = 8 -> -1; row 1
  # 18 - 14 = 4 -> -0.5; row 2 below 40 - 8 -> 0. Against R alone all three were below 32: 0.
  filters = FilterConfig(dynamic_sampling=False, max_refill_rounds=0, overlong_filter=False,
                         overlong_buffer=buffer, overlong_penalty=1.0)
  scores = score(batch, None, filters, R)
  np.testing.assert_allclose(scores.reward_B, [0.0 - 1.0, 1.0 - 0.5, 0.0 - 0.0])


# (example, its task, an example, a call whose output is the longest a turn can ask for, its observation)
REACHABLE = [
    # "<result>108</result>": 99 + 9, the task's largest sum
    ("arithmetic_calculator", lambda cfg: ArithmeticTask(digits=cfg.task.digits, digits2=cfg.task.digits2),
     Example(prompt="99+9=", answer="108"), "<calc>99+9{}</calc>", "<result>108</result>"),
    # 9**99 prints 95 digits, cut to env.max_observation_tokens (24) ending in TRUNCATED
    ("countdown_python", lambda cfg: CountdownTask(n_numbers=cfg.task.n_numbers, max_number=cfg.task.max_number),
     Example(prompt="2,6,8>10:", answer="10"), "<python>9**99{}</python>",
     "<result>" + str(9**99)[:10] + TRUNCATED + "</result>"),
]


@pytest.mark.parametrize("name,task,ex,call,observation", REACHABLE, ids=[r[0] for r in REACHABLE])
def test_the_tool_examples_turn_limits_can_be_reached(pool, name, task, ex, call, observation):
  """configs/examples/arithmetic_calculator.py and countdown_python.py: with every turn as long as it
  may be (a call of env.max_turn_tokens tokens) and every result the longest it can be (the task's
  largest value, or a printed value cut to env.max_observation_tokens), the episode reaches its turn
  limit instead of running out of room, and fills that room exactly."""
  cfg = from_config_dict(load_config(f"examples/{name}"))
  env_cfg = cfg.env
  env = registry.make_env(env_cfg, task(cfg), pool, TOK)
  call = call.format(" " * (env_cfg.max_turn_tokens - len(call.format(""))))
  assert len(TOK.encode(call)) == env_cfg.max_turn_tokens

  def sample(ids, max_new_tokens, stop_strings):
    turn = TOK.encode(call)
    return turn[:max_new_tokens], len(turn) > max_new_tokens

  prompt_len = len(PlainRenderer(TOK).opening_ids(env.reset(ex)))
  limits = EpisodeLimits(max_turn_tokens=env_cfg.max_turn_tokens, max_context_tokens=prompt_len + env_cfg.max_tokens,
                         max_response_tokens=env_cfg.max_tokens)
  result = run_episode(env, PlainRenderer(TOK), ex, limits, sample)
  assert (result.status, result.n_turns) == ("turn_limit", env_cfg.max_turns)
  # max_turns turns of max_turn_tokens and the max_turns - 1 results between them, and they fill the room
  assert TOK.decode(result.rendered.ids_T[result.rendered.prompt_len:]) == observation.join([call] * env_cfg.max_turns)
  assert len(result.rendered.ids_T) - result.rendered.prompt_len == \
      env_cfg.max_turns * env_cfg.max_turn_tokens + (env_cfg.max_turns - 1) * len(observation) == env_cfg.max_tokens
