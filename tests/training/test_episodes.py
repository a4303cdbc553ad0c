"""Multi-turn episodes in the trainer (training/episodes.py): the token-in/token-out rows, the `env`
config section, and two RL steps of episodes end to end, where the environment's tokens weigh zero,
the trained ids are the sampled ids, and a tool that hangs or crashes ends only its own episode."""

import base64
import json
import os
import types

import numpy as np
import pytest

import episode_tools
from run_helpers import load_config, make_trainer, shrink
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.envs import registry
from jaxrl_llm.envs.base import Observation
from jaxrl_llm.envs.builtin_tools import CALCULATOR
from jaxrl_llm.envs.config import EnvConfig
from jaxrl_llm.envs.episode import Episode, EpisodeLimits, run_episode
from jaxrl_llm.envs.pool import ToolLimits, ToolPool
from jaxrl_llm.envs.render import PlainRenderer
from jaxrl_llm.envs.tool_env import ToolEnv
from jaxrl_llm.model.tokenizer import CharTokenizer
from jaxrl_llm.rundir import inspect_page, token_dump
from jaxrl_llm.sampling.rollout import FINISH_EOS, FINISH_LENGTH, FINISH_STOP
from jaxrl_llm.sampling.turns import SampledTurns
from jaxrl_llm.tasks.arithmetic import ArithmeticTask
from jaxrl_llm.tasks.base import Example
from jaxrl_llm.training import episodes as episodes_lib
from jaxrl_llm.training import provenance
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training.defaults import get_config
from jaxrl_llm.training.score import FilterConfig, episode_rewards, overlong_keep, policy_budget, score

TOK = CharTokenizer()
LIMITS = ToolLimits(timeout_s=1.0, cpu_s=1.0, memory_mb=512, output_chars=4096, file_mb=1)


# The module-scoped fixtures run once: the module's tests go to one pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("training.test_episodes")


@pytest.fixture(scope="module")
def pool():
  with ToolPool(2, LIMITS) as p:
    yield p


def scripted_rounds(script):
  """A round sampler: row b's turn k is script[b][k] (text, finish), log mu -0.01 per id in order."""
  def sample_round(contexts, budgets, rnd):
    ids, logps, finish = [], [], []
    for b, n in enumerate(budgets):
      text, how = script[b][rnd] if n else ("", FINISH_LENGTH)
      row = TOK.encode(text) + ([TOK.eos_id] if how == FINISH_EOS else [])
      row = row[:n]
      ids.append(tuple(row))
      logps.append(-0.01 * np.arange(1, len(row) + 1, dtype=np.float32) - rnd)
      finish.append(how)
    return SampledTurns(tuple(ids), tuple(logps), np.asarray(finish, np.int32))
  return sample_round


def test_episode_rows_are_token_in_token_out(pool):
  """Three calculator episodes from scripted turns: a call then the answer, a direct wrong answer, a
  turn cut at its budget. Each row's policy tokens are the sampled ids in order, the result the
  environment wrote is context only, log mu sits on the policy's tokens, turns count up."""
  task = ArithmeticTask(digits=1)
  ex = Example(prompt="3+4=", answer="7")
  limits = EpisodeLimits(max_turn_tokens=16, max_context_tokens=6 + 40, max_response_tokens=40)
  episodes = [Episode(ToolEnv(task, (CALCULATOR,), pool, call_format="tags", max_turns=3, tokenizer=TOK,
                              instructions=False), PlainRenderer(TOK), ex, limits) for _ in range(3)]
  script = [[("<calc>3+4</calc>", FINISH_STOP), ("7", FINISH_EOS)],
            [("8", FINISH_EOS)],
            [("x" * 16, FINISH_LENGTH)]]
  played = episodes_lib.play(episodes, scripted_rounds(script))
  batch = episodes_lib.episode_batch(played, [ex] * 3, prompt_len=8, response_len=40, tokenizer=TOK, version=5)
  assert batch.statuses == ("answer", "answer", "token_limit") and batch.episodic
  assert batch.reward_parts == ({"correct": 1.0, "format": 1.0}, {"correct": 0.0, "format": 1.0},
                                {"correct": 0.0, "format": 0.0})
  # Row 0: "<calc>3+4</calc>" (16, sampled) "<result>7</result>" (18, the environment's) "7<eos>" (2, sampled).
  row = TOK.encode("<calc>3+4</calc><result>7</result>7") + [TOK.eos_id]
  np.testing.assert_array_equal(batch.tokens_BR[0, :36], row)
  np.testing.assert_array_equal(batch.context_BR[0], np.arange(40) < 36)
  np.testing.assert_array_equal(batch.mask_BR[0], (np.arange(40) < 16) | ((np.arange(40) >= 34) & (np.arange(40) < 36)))
  np.testing.assert_array_equal(batch.turn_BR[0, :36], [0] * 16 + [1] * 20)
  # log mu: turn 0's -0.01 k, turn 1's -1 - 0.01 k; 0 on the environment's tokens and the padding
  np.testing.assert_allclose(np.asarray(batch.behav_logp_BR)[0, :16], -0.01 * np.arange(1, 17), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(batch.behav_logp_BR)[0, 34:36], [-1.01, -1.02], rtol=1e-6)
  assert not np.asarray(batch.behav_logp_BR)[0, 16:34].any() and not np.asarray(batch.behav_logp_BR)[0, 36:].any()
  # The opening prompt, BOS + "3+4=", left-padded to 8.
  np.testing.assert_array_equal(batch.prompt_BP[0], [TOK.pad_id] * 3 + [TOK.bos_id] + TOK.encode("3+4="))
  assert batch.length_B.tolist() == [18, 2, 16] and batch.truncated_B.tolist() == [False, False, True]
  assert batch.version_B.tolist() == [5, 5, 5] and batch.responses[0] == "<calc>3+4</calc><result>7</result>7"
  # Rows 1 and 2: one turn, every token the policy's.
  assert (batch.context_BR[1:] == batch.mask_BR[1:]).all() and batch.mask_BR[2].sum() == 16
  m = episodes_lib.episode_metrics(batch)
  assert (m["env/status_answer"], m["env/status_token_limit"], m["env/status_tool_crash"]) == (2.0, 1.0, 0.0)
  assert m["env/turns_mean"] == pytest.approx((2 + 1 + 1) / 3) and m["env/observation_tokens_mean"] == 6.0
  assert set(m) == {f"env/status_{s}" for s in episodes_lib.ENDINGS} | {"env/turns_mean",
                                                                       "env/observation_tokens_mean"}
  # The step's reward: correct + data.format_weight * format.
  reward, correct = episode_rewards(batch.reward_parts, 0.5)
  np.testing.assert_allclose(reward, [1.5, 0.5, 0.0])
  np.testing.assert_allclose(correct, [1.0, 0.0, 0.0])
  # select / concat keep the labels with their rows
  two = batch.select(np.array([2, 0]))
  assert two.statuses == ("token_limit", "answer") and (two.context_BR[1] == batch.context_BR[0]).all()


def test_a_row_that_does_not_fit_is_an_error(pool):
  ex = Example(prompt="3+4=", answer="7")
  ep = Episode(ToolEnv(ArithmeticTask(digits=1), (CALCULATOR,), pool, call_format="tags", tokenizer=TOK,
                       instructions=False), PlainRenderer(TOK), ex, EpisodeLimits(16, 100))
  played = episodes_lib.play([ep], scripted_rounds([[("77", FINISH_EOS)]]))
  with pytest.raises(ValueError, match="do not fit the batch's 4 \\+ 40"):
    episodes_lib.episode_batch(played, [ex], prompt_len=4, response_len=40, tokenizer=TOK)


# ---- the env section ----------------------------------------------------------------------------

def test_env_section_defaults_and_old_workdirs():
  cfg = from_config_dict(get_config("gspo"))
  assert cfg.env == EnvConfig() and cfg.env.name == "none" and not cfg.env.active
  assert cfg.response_len == cfg.rollout.max_response_len
  old = provenance.plain_config(cfg)
  del old["env"], old["task"]["tool_demos"]  # a config.json written before either existed
  assert provenance.plain_config(from_config_dict(provenance.complete(old))) == provenance.plain_config(cfg)
  assert provenance.result_changes(old, provenance.plain_config(cfg)) == {}


@pytest.mark.parametrize("overrides, message", [
    ({"env.name": "calculater"}, "config.env.name='calculater' is invalid: allowed \\('none', 'calculator'"),
    ({"env.name": "calculator", "rollout.record_topk": 2}, "config.rollout.record_topk=2 is invalid"),
    ({"env.name": "calculator", "teacher.source": "self"}, "config.teacher.source='self' is invalid"),
    ({"env.max_turn_tokens": 64, "env.max_tokens": 32}, "config.env.max_turn_tokens=64 is invalid: at most "
                                                        "env.max_tokens=32"),
    ({"env.name": "calculator", "env.max_turn_tokens": 4, "env.max_tokens": 8, "filters.overlong_buffer": 8},
     "config.filters.overlong_buffer=8 is invalid: must be < env.max_tokens=8"),
    ({"task.name": "chain", "task.tool_demos": True}, "config.task.tool_demos=True is invalid: False for "
                                                      "task.name='chain': the tasks with tool demonstrations are "
                                                      "arithmetic, countdown"),
])
def test_env_section_refusals(overrides, message):
  from jaxrl_llm.training.tiny import apply_settings

  with pytest.raises(ConfigError, match=message):
    from_config_dict(apply_settings(get_config("gspo"), overrides))


class BrokenEnv:
  name, stop_strings = "broken", ()

  def reset(self, example):
    raise KeyError("no system prompt for this task")


def test_a_misconfigured_environment_stops_before_the_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("broken", lambda cfg, task, pool, tok: BrokenEnv())
  cfg = from_config_dict(shrink(get_config("gspo"), **{"env.name": "broken"}))
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError) as e:
    make_trainer(cfg, workdir, lambda s: None)
  assert str(e.value).count("\n") == 0
  assert str(e.value).startswith("config.env.name='broken' cannot start an episode on example 0 (")
  assert "KeyError" in str(e.value) and not workdir.exists()


# ---- two RL steps of episodes ---------------------------------------------------------------------

class FlakyEnv:
  """Whatever the policy writes: turn 0 calls the echo tool (its result is the observation); turn 1
  ends the episode by the environment's kind (the count of environments made before it, mod 3, so
  every batch has each): 0 an answer, correct when the turn's text has an even length; 1 a call of a
  tool that hangs; 2 of one that crashes."""

  name, stop_strings = "flaky", ()
  made = 0

  def __init__(self, pool):
    self.pool, self.kind = pool, FlakyEnv.made % 3
    FlakyEnv.made += 1

  def reset(self, example):
    self.example, self.turns = example, 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    self.turns += 1
    if self.turns == 1:
      out = self.pool.run(episode_tools.echo.__module__ + ":echo", {"x": "ok"})
      return Observation(({"role": "tool", "content": f"<result>{out.output}</result>"},), {"correct": 0.0},
                         False, "tool_result")
    kind = self.kind
    if kind == 0:
      return Observation((), {"correct": float(len(TOK.decode(turn)) % 2 == 0)}, True, "answer")
    out = self.pool.run(f"{episode_tools.__name__}:{'hangs' if kind == 1 else 'crashes'}", {})
    return Observation((), {"correct": 0.0}, True, out.status, out.detail)


FLAKY = pytest.mark.xdist_group("training.test_episodes.flaky_run")


@pytest.fixture(scope="session")  # its tests share one xdist worker (FLAKY): the run is made once
def flaky_run(tmp_path_factory):
  """Two GSPO steps of FlakyEnv episodes (tiny model, 8 prompts x 4), step 1 dumped; every round's
  turns as the sampler returned them, per play (the evaluations play episodes too)."""
  workdir = tmp_path_factory.mktemp("flaky")
  rounds_per_step = []
  real_play = episodes_lib.play

  def recording_play(episodes, sample_round, executor=None, fault_point=None):
    rounds = []
    rounds_per_step.append(rounds)

    def record(contexts, budgets, rnd):
      out = sample_round(contexts, budgets, rnd)
      rounds.append((list(budgets), out))
      return out
    return real_play(episodes, record, executor, fault_point)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(registry, "_ENVS", dict(registry._ENVS))
    mp.setattr(episodes_lib, "play", recording_play)
    registry.register_env("flaky", lambda cfg, task, pool, tok: FlakyEnv(pool))
    cfg = from_config_dict(shrink(get_config("gspo"), **{
        "env.name": "flaky", "env.max_turns": 3, "env.max_turn_tokens": 6, "env.max_tokens": 40,
        "env.tools.timeout_s": 1.0, "env.tools.cpu_s": 1.0, "train.steps": 2, "log.dump_steps": (1,)}))
    tr = make_trainer(cfg, workdir, lambda s: None)
    tr.run()
  arrays, info = token_dump.read_dump(str(workdir), 1)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return dict(arrays=arrays, info=info, rows=rows, rounds=rounds_per_step, cfg=tr.cfg)


@pytest.mark.slow
@FLAKY
def test_hanging_and_crashing_tools_end_their_episodes_and_the_run_goes_on(flaky_run):
  rows = flaky_run["rows"]
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    counts = {k[len("env/status_"):]: v for k, v in r.items() if k.startswith("env/status_")}
    assert sum(counts.values()) == 32 and set(counts) == set(episodes_lib.ENDINGS)
    assert counts["tool_timeout"] > 0 and counts["tool_crash"] > 0 and counts["answer"] > 0
    assert counts["tool_timeout"] + counts["tool_crash"] + counts["answer"] == 32
    assert r["env/turns_mean"] == 2.0 and np.isfinite(r["loss/total"]) and r["update/skipped_nonfinite"] == 0.0
  statuses = flaky_run["info"]["statuses"]
  assert len(statuses) == 32 and set(statuses) == {"answer", "tool_timeout", "tool_crash"}


@pytest.mark.slow
@FLAKY
def test_trained_ids_are_the_sampled_ids(flaky_run):
  """Step 1's rows, as dumped from its training batch, hold on their policy tokens exactly the ids and
  log mu the sampler returned, round after round."""
  # The plays of the run: the start evaluation (8 examples, greedy), steps 1 and 2 (32 episodes), the end's.
  plays = flaky_run["rounds"]
  assert [len(rounds[0][0]) for rounds in plays] == [8, 32, 32, 8]
  a, rounds = flaky_run["arrays"], plays[1]
  assert len(rounds) == 2  # two turns per episode
  for b in range(32):
    ids = sum((out.ids[b] for budgets, out in rounds if budgets[b]), ())
    logp = np.concatenate([out.behav_logp[b] for budgets, out in rounds if budgets[b]])
    sampled = a["sampled_BR"][b]
    assert a["tokens_BR"][b][sampled].tolist() == list(ids)
    np.testing.assert_array_equal(a["behav_logp_BR"][b][sampled], logp)
    assert (a["loss_mask_BR"][b] == sampled).all()


@pytest.mark.slow
@FLAKY
def test_environment_tokens_weigh_zero(flaky_run):
  a = flaky_run["arrays"]
  env = a["context_BR"] & ~a["sampled_BR"]
  obs = TOK.encode("<result>ok</result>")
  assert (env.sum(axis=1) == len(obs)).all()
  for b in range(32):
    assert a["tokens_BR"][b][env[b]].tolist() == obs and (a["turn_BR"][b][env[b]] == 1).all()
  # The gradient weight lambda A W of the master equation (docs/objectives.md eq. 9.1), each of its
  # factors that the loss zeroes off its mask, and every mask / clip flag, are 0 on them.
  for name in ("factor_lambda_A_W_KBR", "factor_lambda_KBR", "factor_A_KBR", "factor_C_KBR"):
    assert not a[name][:, env].any(), name
  flags = [k for k in a if k.startswith("flag_")]
  assert flags and not any(a[k][:, env].any() for k in flags)
  assert not a["adv_in_BR"][env].any() and not a["prox_logp_BR"][env].any() and not a["behav_logp_BR"][env].any()
  assert a["factor_lambda_KBR"][0][a["loss_mask_BR"]].all()  # the policy's tokens do weigh
  # The recompute reads the observation: log pi_prox of the second turn's tokens equals log mu (the same
  # f32 weights and context), which it would not if the environment's tokens were left out.
  second = a["sampled_BR"] & (a["turn_BR"] == 1)
  assert second.sum() > 32 and np.abs(a["measured_log_c_BR"][second]).max() < 1e-4


@pytest.mark.slow
@FLAKY
def test_the_inspector_greys_the_environment_tokens(flaky_run):
  a, info = flaky_run["arrays"], flaky_run["info"]
  data = inspect_page.page_data(a, info)
  shown = a["context_BR"]
  assert data["offsets"][-1] == shown.sum() and data["meta"]["n_env_tokens"] == (shown & ~a["sampled_BR"]).sum()
  env = np.frombuffer(base64.b64decode(data["env"]["b64"]), np.uint8)
  np.testing.assert_array_equal(env, (~a["sampled_BR"])[shown])
  assert data["seq"]["status"] == info["statuses"]
  html = inspect_page.render(a, info)
  assert 'class="note"' in html and "the environment's" in html


@pytest.mark.slow
def test_the_calculator_example_runs(tmp_path):
  """configs/examples/arithmetic_calculator.py, shrunk: a short warm start on tool demonstrations, then
  two RL steps of calculator episodes."""
  c = shrink(load_config("examples/arithmetic_calculator"), **{
      "train.steps": 2, "sft.steps": 20, "sft.batch_size": 32, "sft.lr": 0.02, "task.digits": 1,
      "rollout.prompts_per_step": 8, "rollout.group_size": 2, "rollout.max_response_len": 48})
  cfg = from_config_dict(c)
  assert (cfg.env.name, cfg.env.call_format, cfg.task.tool_demos) == ("calculator", "tags", True)
  tr = make_trainer(cfg, tmp_path, lambda s: None)
  summary = tr.run()
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2] and summary["rl_steps"] == 2
  assert 0.0 <= summary["eval_accuracy_end"] <= 1.0  # greedy calculator episodes on the held-out examples
  for r in rows:
    assert sum(v for k, v in r.items() if k.startswith("env/status_")) == 16
    assert np.isfinite(r["loss/total"])
  # `python -m jaxrl_llm.evaluate` plays the same greedy episodes: its pass@1 is the run's last evaluation.
  from jaxrl_llm.evaluate import evaluate_steps

  out = evaluate_steps(str(tmp_path), n_samples=2, ks=(2,), log=lambda s: None)
  (step, table), = out.items()
  assert step == 2 and table["pass@1_greedy"] == summary["eval_accuracy_end"] and 0.0 <= table["pass@2"] <= 1.0


def _slow_reward(prompt, response, answer):
  import time
  time.sleep(30)
  return 1.0


def test_tool_env_times_out_its_verifier_off_the_main_thread(pool):
  """The rollout steps episodes in threads, where SIGALRM cannot interrupt a verifier: ToolEnv then
  waits for it until its deadline, and the episode ends "answer" with reward 0."""
  import concurrent.futures
  import time

  task = ArithmeticTask(digits=1)
  object.__setattr__(task, "reward_fn", _slow_reward)
  env = ToolEnv(task, (CALCULATOR,), pool, call_format="tags", tokenizer=TOK, reward_timeout_s=0.2,
                instructions=False)
  env.reset(Example(prompt="3+4=", answer="7"))
  t0 = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(1) as ex:
    obs = ex.submit(env.step, "7").result()
  assert time.monotonic() - t0 < 5.0
  assert (obs.status, obs.reward_parts, obs.detail) == ("answer", {"correct": 0.0, "format": 0.0},
                                                        "the reward function timed out")


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"Chromium is not installed at {CHROMIUM}")
def test_the_episode_page_in_headless_chromium(flaky_run, tmp_path):
  """The environment's tokens are drawn greyed, in no colour, and their tooltip says why they weigh zero."""
  from playwright.sync_api import sync_playwright

  a, info = flaky_run["arrays"], flaky_run["info"]
  path = tmp_path / "page.html"
  path.write_text(inspect_page.render(a, info), encoding="utf-8")
  shown, env = a["context_BR"], a["context_BR"] & ~a["sampled_BR"]
  offsets = np.concatenate([[0], np.cumsum(shown.sum(1))])
  t = int(np.flatnonzero(env[0])[0])
  i = offsets[0] + int(shown[0, :t].sum())  # the first observation token of sequence 0
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(f"file://{path}")
    page.wait_for_selector("#seqs .t")
    assert page.eval_on_selector_all("#seqs .seq[data-b='0'] .t.env", "els => els.length") == int(env[0].sum())
    span = page.locator(f'#seqs .t[data-i="{i}"]')
    assert "env" in span.get_attribute("class") and span.get_attribute("style") is None
    assert page.locator(f'#seqs .t[data-i="{i - 1}"]').get_attribute("style")  # the policy's token before: coloured
    span.hover()
    page.wait_for_selector("#tip:not([hidden])")
    assert "the environment's token (an observation)" in page.inner_text("#tip .why")
    assert "episode ended " + info["statuses"][0] in page.inner_text("#seqs .seq[data-b='0'] .head")
    assert "of the environment" in page.inner_text("#runinfo")
    browser.close()
  assert not problems, problems


class EchoEnv:
  """Two observations ("<result>N</result>", N the turn's length), then done: three turns per episode
  whatever the model writes, so every round after the first continues a kept cache."""

  name, stop_strings = "echo", ("</calc>",)

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    self.turns += 1
    if self.turns < 3:
      return Observation(({"role": "tool", "content": f"<result>{len(turn)}</result>"},), {"correct": 0.0},
                         False, "tool_result")
    return Observation((), {"correct": 1.0}, True, "answer")


@pytest.mark.slow
def test_the_kept_cache_plays_the_reference_episodes(monkeypatch):
  """The trainer's episode player with env.keep_cache (the default), and on 5 continuous slots
  (rollout.continuous_slots, sampling/episode_slots.py: 12 episodes, so some wait for a slot; through
  the built-in engine's turn sampler and EpisodeEngine, the training's path), gives
  the rows of re-encoding every turn's whole history: the same ids, labels and statuses, log mu to
  float rounding."""
  import jax

  from jaxrl_llm.model import ModelConfig, init_params
  from jaxrl_llm.sampling.engine import JaxSampler
  from jaxrl_llm.sampling.episode_slots import EpisodeSlots

  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("echo", lambda cfg, task, pool, tok: EchoEnv())
  model_cfg = ModelConfig.tiny(TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                               d_ff=64, init_std=0.3)
  params = init_params(model_cfg, jax.random.key(0))
  task = ArithmeticTask(digits=1)
  examples = task.examples("train", 12)
  from jaxrl_llm.sampling.config import SamplingConfig

  sampling = SamplingConfig(temperature=1.0, max_new_tokens=8, pad_id=TOK.pad_id, eos_ids=(TOK.eos_id,))
  batches = {}
  for way, keep, slots in (("kept", True, 0), ("reference", False, 0), ("slots", True, 5)):
    cfg = from_config_dict(shrink(get_config("gspo"), **{
        "env.name": "echo", "env.max_turns": 3, "env.max_turn_tokens": 8, "env.max_tokens": 96,
        "env.keep_cache": keep, "data.max_prompt_len": 8, "rollout.continuous_slots": slots,
        "rollout.decode_chunk": 3}))
    player = episodes_lib.EpisodePlayer(cfg, task, TOK)
    try:
      if way == "slots":  # the training's path: the built-in engine's turn sampler
        engine = JaxSampler(model_cfg=model_cfg, sampling_cfg=sampling, tokenizer=TOK, slots=slots, chunk=3)
        engine.sync(params, 0)
        prompts = types.SimpleNamespace(prompts=[e.prompt for e in examples], answers=[e.answer for e in examples],
                                        tags=[e.tag for e in examples])
        assert isinstance(engine.turn_sampler(player, jax.random.key(1)), EpisodeSlots)
        batches[way] = episodes_lib.EpisodeEngine(engine, player, sampling).generate(prompts, jax.random.key(1))
      else:
        batches[way] = player.play(params, model_cfg, examples, sampling, jax.random.key(1))
    finally:
      player.close()
  ref = batches["reference"]
  for way in ("kept", "slots"):
    got = batches[way]
    for name in ("tokens_BR", "mask_BR", "context_BR", "turn_BR", "prompt_BP"):
      np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=f"{way}: {name}")
    np.testing.assert_allclose(np.asarray(got.behav_logp_BR), np.asarray(ref.behav_logp_BR), atol=2e-5, err_msg=way)
    assert got.statuses == ref.statuses, way
  kept = batches["kept"]
  assert (kept.turn_BR.max(axis=1) == 2).sum() >= 6  # most episodes reached their third turn
