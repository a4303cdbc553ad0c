"""ToolEnv and Episode: whole episodes with a scripted policy (word_problems with the calculator in
the json format, countdown with the Python tool in the tag format), every ending status, and the
registry."""

import dataclasses

import pytest

from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import STATUSES, Observation
from jaxrl_llm.envs.builtin_tools import CALCULATOR, PYTHON
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.episode import Episode, EpisodeLimits, run_episode
from jaxrl_llm.envs.render import ChatRenderer, PlainRenderer
from jaxrl_llm.envs.tool_env import ToolEnv
from jaxrl_llm.model.tokenizer import CharTokenizer, load_tokenizer
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.tasks.countdown import CountdownTask
from jaxrl_llm.tasks.word_problems import WordProblemTask

WORD_PROBLEM = Example(prompt="Reply with only the final number, nothing else. Mia has 7 apples. She gets 5 more. "
                              "How many apples does Mia have now?", answer="12")
COUNTDOWN = Example(prompt="3,5,7>22:", answer="3*5+7")
WIDE = EpisodeLimits(max_turn_tokens=64, max_context_tokens=4096)


def scripted(tokenizer, texts, eos=True):
  """A policy that samples `texts` in turn (each tokenised, then EOS when `eos`)."""
  replies = iter(texts)

  def sample(ids, max_new_tokens, stop_strings):
    out = tokenizer.encode(next(replies)) + ([tokenizer.eos_id] if eos else [])
    return out[:max_new_tokens], len(out) > max_new_tokens
  return sample


def test_word_problem_with_the_calculator_json_format(pool, smollm2_tokenizer_dir):
  tok = load_tokenizer(smollm2_tokenizer_dir)
  env = registry.make_env(EnvConfig(name="calculator"), WordProblemTask(), pool, tok)
  texts = ['<tool_call>{"name": "calculator", "arguments": {"expression": "7 + 5"}}</tool_call>', "12"]
  result = run_episode(env, ChatRenderer(tok), WORD_PROBLEM, WIDE, scripted(tok, texts))
  assert (result.status, result.n_turns, result.detail) == ("answer", 2, "")
  assert result.reward_parts == {"correct": 1.0, "format": 1.0}  # math-verify: 12 == 12; a bare number
  r = result.rendered
  sampled = [tok.encode(t) + [tok.eos_id] for t in texts]
  assert r.ids_T[r.policy_T].tolist() == sampled[0] + sampled[1]
  # The calculator's answer came back as a tool message, rendered by SmolLM2's template.
  obs = r.ids_T[(~r.policy_T) & (r.turn_T == 1)]
  assert tok.decode(obs, skip_special_tokens=False) == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"
  opening = tok.decode(r.ids_T[:r.prompt_len], skip_special_tokens=False)
  assert '{"name": "calculator"' in opening and WORD_PROBLEM.prompt in opening


def test_countdown_with_python_tag_format(pool):
  tok = CharTokenizer()
  env = registry.make_env(EnvConfig(name="python", call_format="tags"), CountdownTask(), pool, tok)
  assert env.stop_strings == ("</python>",)
  # The first turn stops at the closing tag (a stop string, no EOS); the result follows it.
  texts = iter(["<python>3*5+7</python>", "3*5+7"])

  def sample(ids, max_new_tokens, stop_strings):
    text = next(texts)
    ids = tok.encode(text) + ([] if text.endswith(stop_strings) else [tok.eos_id])
    return ids, False
  result = run_episode(env, PlainRenderer(tok), COUNTDOWN, WIDE, sample)
  assert (result.status, result.reward_parts) == ("answer", {"correct": 1.0, "format": 1.0})
  text = tok.decode(result.rendered.ids_T[1:])  # after BOS, up to the final EOS
  assert text.endswith("3,5,7>22:<python>3*5+7</python><result>22\n</result>3*5+7")
  assert text.startswith("Tools: write a tool's tag around its input and its result follows in <result></result>.")


def env_for(pool, **kwargs):
  env = ToolEnv(WordProblemTask(), (CALCULATOR, PYTHON), pool, **kwargs)
  env.reset(WORD_PROBLEM)
  return env


def call(name, **arguments):
  import json
  return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


@pytest.mark.parametrize("turn,status", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "7+5"</tool_call>', "malformed_call"),
    (call("search", query="apples"), "unknown_tool"),
    ('<tool_call>{"name": "calculator"}</tool_call>', "bad_arguments"),
    (call("python", code="import os\nos._exit(1)"), "tool_crash"),
    (call("python", code="print('x' * 10_000_000)"), "tool_output_overflow"),
    # bytes(n) is calloc'd: the address space runs out before a page is touched (0.0 s here, against 0.3 s
    # for bytearray(n), which zero-fills each block and once ran past the 2 s timeout under the suite's load)
    (call("python", code="x = []\nwhile True: x.append(bytes(10**7))"), "tool_memory"),
    (call("python", code="while True: pass"), "tool_timeout"),
])
def test_each_failure_ends_its_episode_and_the_pool_goes_on(pool, turn, status):
  env = env_for(pool)
  obs = env.step(turn)
  assert (obs.status, obs.done, obs.messages) == (status, True, ())
  assert obs.reward_parts == {"correct": 0.0, "format": 0.0} and obs.detail
  with pytest.raises(RuntimeError, match="no episode is running"):
    env.step("12")
  # The next episode, on the same pool, runs.
  env.reset(WORD_PROBLEM)
  assert env.step(call("calculator", expression="7+5")).messages == (
      {"role": "tool", "name": "calculator", "tool_call_id": "call00000", "content": "12"},)


def test_tool_error_goes_on_and_the_model_reads_it(pool):
  env = env_for(pool)
  obs = env.step(call("calculator", expression="12/0"))
  assert (obs.status, obs.done) == ("tool_error", False)
  assert obs.messages == ({"role": "tool", "name": "calculator", "tool_call_id": "call00000",
                          "content": "error: division by zero"},)
  obs = env.step(call("calculator", expression="7+5") + call("python", code="print(7 + 5)"))  # parallel calls
  assert obs.status == "tool_result"
  assert [m["content"] for m in obs.messages] == ["12", "12\n"]
  assert env.step("12").status == "answer"


def test_turn_and_token_limits(pool):
  env = env_for(pool, max_turns=2)
  assert env.step(call("calculator", expression="1+1")).status == "tool_result"
  obs = env.step(call("calculator", expression="2+2"))  # the last allowed turn calls a tool
  assert (obs.status, obs.done) == ("turn_limit", True)
  env = env_for(pool, max_turns=2)
  assert env.step("Mia has 7 apples and", truncated=True).status == "token_limit"
  env = env_for(pool, max_turns=1)
  obs = env.step("12")  # a final answer in the last turn is fine
  assert (obs.status, obs.reward_parts["correct"]) == ("answer", 1.0)


def test_context_overflow(pool):
  tok = CharTokenizer()
  env = ToolEnv(CountdownTask(), (CALCULATOR,), pool, call_format="tags", tokenizer=tok)
  renderer = PlainRenderer(tok)
  opening = len(renderer.opening_ids(env.reset(COUNTDOWN)))
  # (a) The opening prompt fills the context.
  episode = Episode(env, renderer, COUNTDOWN, EpisodeLimits(max_turn_tokens=8, max_context_tokens=opening))
  assert (episode.done, episode.status) == (True, "context_overflow")
  assert episode.result().n_turns == 0
  # (b) A turn cut by the room left, not by its own limit.
  episode = Episode(env, renderer, COUNTDOWN, EpisodeLimits(max_turn_tokens=64, max_context_tokens=opening + 5))
  assert episode.turn_budget() == 5
  episode.step(tok.encode("3*5+7"), truncated=True)
  assert episode.status == "context_overflow" and "5 tokens left" in episode.detail
  # (c) An observation after which no turn fits is not appended.
  calc = tok.encode("<calc>3*5+7</calc>")
  limits = EpisodeLimits(max_turn_tokens=64, max_context_tokens=opening + len(calc) + len("<result>22</result>"))
  episode = Episode(env, renderer, COUNTDOWN, limits)
  obs = episode.step(calc)
  assert (obs.status, obs.messages) == ("context_overflow", ())
  assert len(episode.result().rendered.ids_T) == opening + len(calc)
  # (d) One token more of room and it is appended, and the episode goes on.
  limits = dataclasses.replace(limits, max_context_tokens=limits.max_context_tokens + 1)
  episode = Episode(env, renderer, COUNTDOWN, limits)
  assert episode.step(calc).status == "tool_result" and episode.turn_budget() == 1


def test_episode_guards(pool):
  tok = CharTokenizer()
  env = ToolEnv(CountdownTask(), (CALCULATOR,), pool, call_format="tags", tokenizer=tok)
  episode = Episode(env, PlainRenderer(tok), COUNTDOWN, EpisodeLimits(max_turn_tokens=4, max_context_tokens=512))
  with pytest.raises(ValueError, match="a turn of 5 tokens, more than turn_budget\\(\\)=4"):
    episode.step(tok.encode("3*5+7"))
  with pytest.raises(RuntimeError, match="still running"):
    episode.result()
  episode.step(tok.encode("22"))
  assert episode.status == "answer" and episode.reward_parts == {"correct": 0.0, "format": 1.0}
  with pytest.raises(RuntimeError, match="the episode ended \\(answer\\)"):
    episode.step(tok.encode("1"))
  with pytest.raises(ValueError, match="EpisodeLimits.max_turn_tokens=0 is out of range"):
    EpisodeLimits(max_turn_tokens=0, max_context_tokens=8)


def test_observation_and_env_checks(pool):
  with pytest.raises(ValueError, match="Observation.status='ok' is invalid"):
    Observation((), {}, True, "ok")
  with pytest.raises(ValueError, match="Observation.done=False contradicts status='answer'"):
    Observation((), {}, False, "answer")
  with pytest.raises(ValueError, match="Observation.messages must be empty when done"):
    Observation(({"role": "tool", "content": "1"},), {}, True, "answer")
  assert len(STATUSES) == 13
  env = ToolEnv(WordProblemTask(), (CALCULATOR,), pool)
  with pytest.raises(RuntimeError, match="reset first"):
    env.step("12")
  env.reset(WORD_PROBLEM)
  with pytest.raises(TypeError, match="needs ToolEnv.tokenizer"):
    env.step([1, 2, 3])
  with pytest.raises(ValueError, match="ToolEnv.call_format='xml' is invalid"):
    ToolEnv(WordProblemTask(), (CALCULATOR,), pool, call_format="xml")
  with pytest.raises(ValueError, match="distinct names"):
    ToolEnv(WordProblemTask(), (CALCULATOR, CALCULATOR), pool)


def test_registry(pool):
  assert registry.env_names()[:2] == ("calculator", "python")
  with pytest.raises(ValueError, match="config.env.name='calculater' is invalid: allowed \\('calculator', "
                                       "'python'.*did you mean 'calculator'"):
    registry.make_env(EnvConfig(name="calculater"), WordProblemTask(), pool)
  with pytest.raises(ValueError, match="environment 'python' is registered already"):
    registry.register_env("python", lambda cfg, task, pool, tok: None)
  with pytest.raises(ValueError, match="config.env.max_turns=0 is out of range"):
    EnvConfig(max_turns=0)
  env = registry.make_env(EnvConfig(name="python", max_turns=3), CountdownTask(), pool)
  assert (env.name, env.max_turns, [t.name for t in env.tools]) == ("python", 3, ["python"])


def test_add_an_environment_and_a_tool(pool, monkeypatch):
  # docs/architecture.md, "... an environment or a tool", step by step.
  import tool_fixtures
  from jaxrl_llm.envs.tool import Tool

  # Step 1: a module-level function, run in a worker (tool_fixtures.word_count; ToolError for bad input).
  # Step 2: its description.
  words = Tool(name="word_count", fn=tool_fixtures.word_count, tag="count",
               description="Counts the words of a text.",
               parameters={"text": {"type": "string", "description": "the text"}})
  # Step 3: an environment registered by name (monkeypatch stands for the edit of envs/registry.py).
  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("words", lambda cfg, task, pool, tok: ToolEnv(
      task, (words,), pool, call_format=cfg.call_format, max_turns=cfg.max_turns, tokenizer=tok, name=cfg.name))
  # Step 4: an episode, driven as the rollout loop will drive it.
  tok = CharTokenizer()
  env = registry.make_env(EnvConfig(name="words", call_format="tags"), WordProblemTask(), pool, tok)
  result = run_episode(env, PlainRenderer(tok), WORD_PROBLEM, WIDE,
                       scripted(tok, ["<count>seven plus five</count>", "<count> </count>"]))
  assert result.status == "bad_arguments" and result.n_turns == 2  # an empty tag: the recipe's statuses apply
  observed = result.rendered.ids_T[(~result.rendered.policy_T) & (result.rendered.turn_T == 1)]
  assert tok.decode(observed) == "<result>3</result>"
  env.reset(WORD_PROBLEM)
  assert env.step("<count>seven</count>").messages == ({"role": "tool", "content": "<result>1</result>"},)


def test_the_smollm2_calculator_examples_turn_limit_can_be_reached(pool, smollm2_tokenizer_dir):
  """configs/examples/smollm2_calculator.py: with every turn a call of env.max_turn_tokens tokens (its
  EOS included) whose result is cut to env.max_observation_tokens, the episode reaches its turn limit
  instead of running out of room, and fills that room (env.max_tokens) exactly."""
  from run_helpers import load_config  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.tasks.registry import make_task  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.training.config import from_config_dict  # pylint: disable=import-outside-toplevel
  from jaxrl_llm.training.episodes import env_renderer  # pylint: disable=import-outside-toplevel

  cfg = from_config_dict(load_config("examples/smollm2_calculator"))
  tok = load_tokenizer(smollm2_tokenizer_dir)
  env = registry.make_env(cfg.env, make_task(cfg), pool, tok)
  renderer = env_renderer(cfg.env, env, tok, cfg.data.chat_template)
  # 10**50 has 51 digits: more than max_observation_tokens, so every result is cut to the most it may be.
  # "+0" terms pad the call to exactly max_turn_tokens tokens with its EOS.
  want = cfg.env.max_turn_tokens - 1
  calls = [f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "10**50{"+0" * k}"}}}}</tool_call>'
           f'{" " * s}' for k in range(40) for s in (0, 1)]
  call = next(c for c in calls if len(tok.encode(c)) == want)
  turn = tok.encode(call) + [tok.eos_id]

  def sample(ids, max_new_tokens, stop_strings):
    return turn[:max_new_tokens], len(turn) > max_new_tokens

  ex = make_task(cfg).examples("eval", 1)[0]
  prompt_len = len(renderer.opening_ids(env.reset(ex)))
  limits = EpisodeLimits(max_turn_tokens=cfg.env.max_turn_tokens, max_context_tokens=prompt_len + cfg.env.max_tokens,
                         max_response_tokens=cfg.env.max_tokens)
  result = run_episode(env, renderer, ex, limits, sample)
  assert (result.status, result.n_turns) == ("turn_limit", cfg.env.max_turns)
  r = result.rendered
  assert r.ids_T[r.policy_T].tolist() == turn * cfg.env.max_turns  # no turn was cut short
  observations = [tok.decode(r.ids_T[(~r.policy_T) & (r.turn_T == t)], skip_special_tokens=False) for t in (1, 2)]
  for obs in observations:  # the result cut to max_observation_tokens, in the template's tool message
    assert obs.startswith("\n<|im_start|>tool\n" + "1" + "0" * 8) and "[truncated]" in obs, obs
  assert len(r.ids_T) - r.prompt_len == cfg.env.max_tokens  # the room is filled exactly
