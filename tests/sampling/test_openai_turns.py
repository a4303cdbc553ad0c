"""Episode turns through the `openai` engine (sampling/openai_turns.py), against the stand-in of
llama.cpp's server: one token-id request per live context with its budget as max_tokens and no
stop strings, the turn cut on the host after an end id or the first stop string, the kept ids and
log mu a prefix of what the server sampled."""

import math
import os
import sys

import jax
import numpy as np
import pytest

from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.openai_turns import parse_turn, sample_turns_openai
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP

sys.path.insert(0, os.path.dirname(__file__))
from openai_stand_in import TOK, engine, sampling, server  # noqa: E402,F401


def test_turns_are_prefixes_of_the_servers_answers_cut_on_the_host(server):  # noqa: F811
  eng = engine(server, sampling(temperature=1.0))
  texts = ["12+3=", "ab", "7*6=", "9", "1+1=", "xy", "0", "42-"]
  contexts = [[TOK.bos_id] + TOK.encode(t) for t in texts]
  budgets = [6, 0, 5, 6, 6, 4, 6, 6]
  stops = ("1", "2", "5", "8", "a", "e")
  turns = sample_turns_openai(eng, contexts, budgets, jax.random.key(0), stop_strings=stops)
  assert turns.ids[1] == () and turns.finish_B[1] == FINISH_LENGTH and turns.behav_logp[1].shape == (0,)
  by_prompt = {tuple(r["prompt"]): r for r in server.requests}
  assert len(server.requests) == 7 and tuple(contexts[1]) not in by_prompt  # no request for a finished row
  finishes = set()
  for b in (0, 2, 3, 4, 5, 6, 7):
    req = by_prompt[tuple(contexts[b])]
    assert req["max_tokens"] == budgets[b] and "stop" not in req  # token ids in, no stop strings sent
    content = server.answers[req["seed"]]["choices"][0]["logprobs"]["content"]
    full = [c["id"] for c in content]
    ids = list(turns.ids[b])
    assert full[:len(ids)] == ids  # a prefix of what the server sampled
    text = TOK.decode(ids) if TOK.eos_id not in ids else TOK.decode(ids[:-1])
    held = [i for i in range(1, len(full) + 1) if any(s in TOK.decode(full[:i]) for s in stops)]
    if TOK.eos_id in full[:held[0] if held else len(full)]:
      want, finish = full[:full.index(TOK.eos_id) + 1], FINISH_EOS
    elif held:
      want, finish = full[:held[0]], FINISH_STOP
      assert any(text.endswith(s) for s in stops)
    else:
      want, finish = full, FINISH_LENGTH
    assert ids == want and turns.finish_B[b] == finish
    finishes.add(finish)
    np.testing.assert_allclose(turns.behav_logp[b], [math.log(c["prob"]) for c in content[:len(ids)]], rtol=1e-6)
  assert FINISH_STOP in finishes  # a real cut happened


def test_parse_turn_refuses_an_unknown_stop_and_a_long_answer():
  entry = lambda i: {"id": i, "prob": 0.5}  # noqa: E731
  resp = {"choices": [{"logprobs": {"content": [entry(5), entry(6)]}, "finish_reason": "stop"}]}
  kw = dict(ends={1}, eos_ids=(1,), vocab_size=100, stop_strings=(), tokenizer=TOK)
  with pytest.raises(ConfigError, match="stopped a turn on token 6, which is not in the trainer's end ids"):
    parse_turn(resp, 4, **kw)
  with pytest.raises(ValueError, match="2 tokens for max_tokens=1"):
    parse_turn(resp, 1, **kw)
  resp["choices"][0]["finish_reason"] = "length"
  ids, logp, finish = parse_turn(resp, 2, **kw)
  assert ids == (5, 6) and finish == FINISH_LENGTH and logp.tolist() == pytest.approx([math.log(0.5)] * 2)


class _Answers:
  """An environment of three turns: after each of the first two, an observation that says how long the
  turn was; an episode whose turn was cut ends there."""

  stop_strings = ("=",)

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    from jaxrl_llm.envs.base import Observation
    self.turns += 1
    if truncated:
      return Observation((), {"correct": 0.0}, True, "token_limit")
    if self.turns < 3:
      return Observation(({"role": "tool", "content": f"<{len(turn)}>"},), {"correct": 0.0}, False, "tool_result")
    return Observation((), {"correct": 1.0}, True, "answer")


def test_episodes_as_they_come_are_the_lock_step_episodes(server):  # noqa: F811
  """`OpenAISlots` sends each turn as soon as its episode needs it (training/episodes.play_slots), the
  lock-step rounds send every live episode's turn together (`play`): the same requests, so the same
  episodes from a server whose answers depend on the request alone, seed included."""
  import concurrent.futures

  from jaxrl_llm.envs.episode import Episode, EpisodeLimits
  from jaxrl_llm.envs.render import PlainRenderer
  from jaxrl_llm.sampling.openai_turns import OpenAISlots, round_sampler
  from jaxrl_llm.tasks.base import Example
  from jaxrl_llm.training.episodes import play, play_slots

  eng = engine(server, sampling(temperature=1.0, n_samples=1), concurrency=3)
  limits = EpisodeLimits(max_turn_tokens=6, max_context_tokens=60, max_response_tokens=50)
  prompts = ["12+3=", "7*6=", "9-", "1+1=", "40+2=", "8", "3*3=", "5+"]

  def episodes():
    return [Episode(_Answers(), PlainRenderer(TOK), Example(prompt=p, answer=""), limits) for p in prompts]

  key = jax.random.key(4)
  lock_step = play(episodes(), round_sampler(eng, key, stop_strings=_Answers.stop_strings))
  n_requests = len(server.requests)
  slots = OpenAISlots(eng, key, stop_strings=_Answers.stop_strings)
  with concurrent.futures.ThreadPoolExecutor(2) as executor:
    as_they_come = play_slots(episodes(), slots, executor)
  slots.close()
  assert len(server.requests) == 2 * n_requests  # one request per turn, both ways
  turns = []
  for a, b in zip(lock_step, as_they_come):
    assert a.sampled == b.sampled and a.result.status == b.result.status
    np.testing.assert_array_equal(a.result.rendered.ids_T, b.result.rendered.ids_T)
    np.testing.assert_array_equal(a.behav_logp, b.behav_logp)
    turns.append(a.result.n_turns)
  assert len(set(turns)) >= 2, turns  # episodes of different lengths: the schedules differ
