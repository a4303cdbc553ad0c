"""Multi-turn episodes sampled by a real llama.cpp server (`rollout.engine=openai` with an environment):
every turn is a token-id prompt of the episode's whole context, the environment's tokens included, and
the trainer trains on exactly the ids the server sampled. With the f32 export the server's log mu of
every policy token, the second turn's conditioned on the environment's observation, equals the
trainer's recompute of log pi_prox. Skips without a llama-server binary, as test_llama_cpp_engine.py."""

import json
import os
import sys

import numpy as np
import pytest
from run_helpers import make_trainer, shrink

from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.rundir import token_dump
from jaxrl_llm.sampling.sync_check import SYNC_TOLERANCE
from jaxrl_llm.training import episodes as episodes_lib
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config

sys.path.insert(0, os.path.dirname(__file__))
from test_llama_cpp_engine import COMMAND, SERVER  # noqa: E402

pytestmark = pytest.mark.skipif(SERVER is None, reason="no runnable llama.cpp llama-server: run "
                                "scripts/build_llama_server.sh, or set JAXRL_LLM_LLAMA_SERVER")
TOK = CharTokenizer()


class TwoTurnEnv:
  """Whatever the policy writes: turn 0 gets the observation "<result>ok</result>", turn 1 ends the episode."""

  name, stop_strings = "two_turn", ()

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    self.turns += 1
    if self.turns == 1:
      return Observation(({"role": "tool", "content": "<result>ok</result>"},), {"correct": 0.0}, False,
                         "tool_result")
    return Observation((), {"correct": float(len(TOK.decode(turn)) % 2 == 0)}, True, "answer")


@pytest.mark.slow
def test_episodes_through_llama_cpp_are_token_in_token_out(tmp_path):
  turns_per_play = []  # per play: {episode: [(ids, log mu), ...]} in turn order
  real_play, real_play_slots = episodes_lib.play, episodes_lib.play_slots

  def recording_play(episodes, sample_round, executor=None, fault_point=None):  # the built-in evaluation's
    turns = {b: [] for b in range(len(episodes))}
    turns_per_play.append(turns)

    def record(contexts, budgets, rnd):
      out = sample_round(contexts, budgets, rnd)
      for b, n in enumerate(budgets):
        if n:
          turns[b].append((out.ids[b], out.behav_logp[b]))
      return out
    return real_play(episodes, record, executor, fault_point)

  def recording_play_slots(episodes, slots, executor=None, fault_point=None):  # the server's turns, as they come
    turns = {b: [] for b in range(len(episodes))}
    turns_per_play.append(turns)
    advance = slots.advance

    def record(steps=()):
      ended = advance(steps)
      for t in ended:
        turns[t.episode].append((t.ids, t.behav_logp))
      return ended
    slots.advance = record
    return real_play_slots(episodes, slots, executor, fault_point)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(registry, "_ENVS", dict(registry._ENVS))
    mp.setattr(episodes_lib, "play", recording_play)
    mp.setattr(episodes_lib, "play_slots", recording_play_slots)
    registry.register_env("two_turn", lambda cfg, task, pool, tok: TwoTurnEnv())
    cfg = from_config_dict(shrink(get_config("gspo"), **{
        "env.name": "two_turn", "env.max_turns": 3, "env.max_turn_tokens": 6, "env.max_tokens": 40,
        "rollout.engine": "openai", "rollout.server.command": COMMAND, "rollout.server.concurrency": 2,
        "rollout.server.sync_every": 1, "train.steps": 2, "log.dump_steps": (1,)}))
    tr = make_trainer(cfg, tmp_path, lambda s: None)
    tr.run()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert r["env/turns_mean"] == 2.0 and r["env/status_answer"] == 32
    assert r["engine/syncs"] >= 1 and np.isfinite(r["loss/total"])
    # f32 export: the server's mu on every policy token = the trainer's pi_prox, turn 2 after the observation
    assert r["mismatch/log_c_abs_mean"] < 1e-3, r["mismatch/log_c_abs_mean"]
  # The plays: the start evaluation (built-in sampler, 8 examples), steps 1 and 2 (the server), the end's.
  assert [len(p) for p in turns_per_play] == [8, 32, 32, 8]
  a, _ = token_dump.read_dump(str(tmp_path), 1)
  turns = turns_per_play[1]
  assert all(len(t) == 2 for t in turns.values())
  observation = TOK.encode("<result>ok</result>")
  for b in range(32):
    ids = sum((t[0] for t in turns[b]), ())
    logp = np.concatenate([t[1] for t in turns[b]])
    sampled = a["sampled_BR"][b]
    assert a["tokens_BR"][b][sampled].tolist() == list(ids)  # trained on exactly what the server sampled
    np.testing.assert_array_equal(a["behav_logp_BR"][b][sampled], logp)
    env = a["context_BR"][b] & ~sampled
    assert a["tokens_BR"][b][env].tolist() == observation and (a["turn_BR"][b][env] == 1).all()
  # log c = log pi_prox - log mu of the second turn's tokens: the server's mu was computed on the context
  # with the observation's ids, as the trainer's recompute is.
  second = a["sampled_BR"] & (a["turn_BR"] == 1)
  assert second.sum() > 32 and np.abs(a["measured_log_c_BR"][second]).max() < SYNC_TOLERANCE["f32"]
