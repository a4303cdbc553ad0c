"""`rollout.overlap`: the next steps' batches generated in the background (training/async_rollout.py).

The strongest check is bit-identity: with the same staleness k, a run with
async rollouts and one without sample the same tokens with the same policy
versions, so their params and (non-timing) metrics are equal bit for bit. The
rest: the version lag per step (s in the first k steps, which sample with
theta_0; k after), the overlap (step s + 1's generation starts, in the
background thread, before step s's update), exact resume after a SIGTERM
stop, a rollout fault raised at the step that needed the batch, the
background thread gone after every run, and an async run through the
`openai` engine's stand-in server (tests/sampling/fake_openai_server.py).

Timing fields (`time/*`, `perf/tokens_per_s`) measure the wall clock and are
left out of every comparison.
"""

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from run_helpers import ONE_DEVICE_XLA_FLAGS, REPO, load_config, make_trainer, shrink
from jaxrl_llm import faults
from jaxrl_llm.checkpointing.config import CheckpointConfig
from jaxrl_llm.checks import ConfigError
from jaxrl_llm.sampling.engine import JaxSampler
from jaxrl_llm.training import step as step_lib
from jaxrl_llm.training.async_rollout import AsyncRollouts, InlineRollouts
from jaxrl_llm.training.config import from_config_dict
from jaxrl_llm.training import loop as loop_lib
from jaxrl_llm.learn.shell import Stopped
from jaxrl_llm.training.loop import Trainer
from jaxrl_llm.training.provenance import plain_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sampling"))
import fake_openai_server  # noqa: E402

THREAD = "jaxrl_llm-rollouts"  # AsyncRollouts' background thread
TIMING = ("time/", "perf/tokens_per_s")


_COMPILED: dict = {}  # run config (but its overlap flag and checkpoint settings) -> the compiled update


@pytest.fixture(autouse=True)
def _cheaper_runs(monkeypatch):
  """Two costs no test here is about, paid once: the runs' report PNG (matplotlib, seconds) is not drawn,
  and the runs of one config (a sync and an async run, a stopped run and its resume: the same program)
  share one compiled update instead of compiling it each (seconds each on the 8-device test mesh)."""
  monkeypatch.setattr(loop_lib, "write_report_safely", lambda workdir, log: None)
  compiled, real = _COMPILED, Trainer.make_updater

  def compile_once(self, state):
    same = dataclasses.replace(self.cfg, rollout=dataclasses.replace(self.cfg.rollout, overlap=False),
                               checkpoint=CheckpointConfig())
    key = repr(same)
    if key not in compiled:
      compiled[key] = real(self, state)
    return compiled[key]

  monkeypatch.setattr(Trainer, "make_updater", compile_once)


def _cfg(k: int, overlap: bool, **overrides):
  return from_config_dict(shrink(load_config("grpo"), **{
      "rollout.staleness": k, "rollout.overlap": overlap, "train.steps": 3, "train.lr": 1e-2,
      "train.warmup_steps": 0, **overrides}))


def _quiet(line):
  del line


def _rollout_threads():
  return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


def _rows(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _timing_rows(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_same_params(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(x, y)


def _saved_steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


class _Timeline:
  """Events of the run in the order they happened, with the thread that made each."""

  def __init__(self):
    self.events, self._cond = [], threading.Condition()

  def add(self, what: str, step: int) -> None:
    with self._cond:
      self.events.append((what, step, threading.current_thread().name))
      self._cond.notify_all()

  def wait_for(self, what: str, step: int, timeout_s: float) -> bool:
    with self._cond:
      return self._cond.wait_for(lambda: any(e[:2] == (what, step) for e in self.events), timeout_s)

  def index(self, what: str, step: int) -> int:
    return next(i for i, e in enumerate(self.events) if e[:2] == (what, step))


def _run(cfg, workdir, timeline: _Timeline | None = None, lines: list | None = None):
  """Trainer.run; with a timeline, every generation and update is recorded, and step s's update
  waits (up to 60 s) for step s + 1's generation to have started. `lines` collects the run's log."""
  tr = make_trainer(cfg, workdir, _quiet if lines is None else lines.append)
  if timeline is None:
    tr.run()
  else:
    real_generate, real_updates = JaxSampler.generate, step_lib.run_updates
    calls = itertools.count()  # one generation per step (no refills), in step order

    def generate(self, prompts, key):
      timeline.add("generate", next(calls))
      return real_generate(self, prompts, key)

    def run_updates(ctx, state, batch, recorder=None, while_updating=None):
      s = int(state.step)
      if s + 1 < cfg.train.steps:
        timeline.wait_for("generate", s + 1, 60.0)
      timeline.add("update_start", s)
      out = real_updates(ctx, state, batch, recorder, while_updating)
      timeline.add("update_end", s)
      return out

    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(JaxSampler, "generate", generate)
      mp.setattr(step_lib, "run_updates", run_updates)
      tr.run()
  assert not _rollout_threads()  # the background thread is gone once run() returns
  return tr


def _assert_same_runs(a, wd_a, b, wd_b, steps: int):
  _assert_same_params(a.final_state.params, b.final_state.params)
  _assert_same_params(a.final_state.lag_params, b.final_state.lag_params)
  rows_a, rows_b = _rows(wd_a), _rows(wd_b)
  assert [r["step"] for r in rows_b] == list(range(1, steps + 1))
  assert rows_a == rows_b
  assert all(r["grad/norm"] > 0 for r in rows_a)  # every step moved the params: equality is a test
  assert len({r["reward/mean"] for r in rows_a}) > 1  # and the steps sampled different batches
  assert a.final_state.data_state == b.final_state.data_state  # the pipeline's position after the last step


def _assert_version_lag(wd, k: int):
  # Step s (0-based) samples with theta_{max(s - k, 0)}: the first k steps with theta_0 (lag s), then lag k.
  for s, r in enumerate(_rows(wd)):
    want = float(min(s, k))
    assert (r["rollout/version_lag_min"], r["rollout/version_lag_mean"], r["rollout/version_lag_max"]) == (
        want, want, want), (wd, s)


# ---- the same run, generated in the background -------------------------------------------

@pytest.mark.slow
def test_staleness_1_async_equals_sync_bit_for_bit_and_overlaps_the_update(tmp_path):
  steps, timeline, lines = 3, _Timeline(), []
  sync = _run(_cfg(1, False, **{"train.steps": steps}), tmp_path / "sync", lines=lines)
  # GRPO corrects nothing against mu: the run says so once, pointing to the measured alternatives.
  notes = [line for line in lines if line.startswith("note: rollout.staleness=1")]
  assert len(notes) == 1 and "'grpo' corrects nothing against mu" in notes[0] and "scalerl_gspo" in notes[0]
  asyn = _run(_cfg(1, True, **{"train.steps": steps}), tmp_path / "async", timeline)
  _assert_same_runs(sync, tmp_path / "sync", asyn, tmp_path / "async", steps)
  for wd in ("sync", "async"):
    _assert_version_lag(tmp_path / wd, 1)

  # The overlap: step s + 1's generation (in the background thread) started before step s's update,
  # which waited up to 60 s for it; a generation that needed step s's result would never start.
  ev = timeline.events
  for s in range(steps):
    assert timeline.index("update_start", s) < timeline.index("update_end", s), ev
    if s + 1 < steps:
      assert timeline.index("generate", s + 1) < timeline.index("update_start", s), ev
  assert {e[2] for e in ev if e[0] == "generate"} == {THREAD}
  assert {e[2] for e in ev if e[0].startswith("update")} == {threading.main_thread().name}
  # time/idle_s: how long the step sat blocked on the background thread, which is its wait for the batch;
  # synchronously the step generates the batch itself (sync + generation) and never idles.
  for r in _timing_rows(tmp_path / "async"):
    assert r["time/idle_s"] == r["time/rollout_wait_s"] >= 0.0 and r["time/rollout_s"] > 0.0
  for r in _timing_rows(tmp_path / "sync"):
    assert r["time/idle_s"] == 0.0 and r["time/rollout_wait_s"] == r["time/sync_s"] + r["time/rollout_s"]


@pytest.mark.slow
def test_staleness_2_async_equals_sync_and_a_sigterm_stop_resumes_exactly(tmp_path):
  """Stopped by SIGTERM after step 3 of 5 (the batches of steps 4 and 5 already made or in the
  making), resumed: the queued batches are regenerated from the checkpoint's lag buffer, key and
  pipeline position (none of them is saved), and the run equals the uninterrupted async and sync runs."""
  k, steps = 2, 5
  sync = _run(_cfg(k, False, **{"train.steps": steps}), tmp_path / "sync")
  full = _run(_cfg(k, True, **{"train.steps": steps}), tmp_path / "async")
  _assert_same_runs(sync, tmp_path / "sync", full, tmp_path / "async", steps)
  for wd in ("sync", "async"):
    _assert_version_lag(tmp_path / wd, k)

  cfg, wd = _cfg(k, True, **{"train.steps": steps}), tmp_path / "stopped"
  tr = make_trainer(cfg, wd, _quiet)
  tr.hooks.append(lambda t, state, m: os.kill(os.getpid(), signal.SIGTERM) if int(state.step) == 3 else None)
  with pytest.raises(Stopped) as stopped:
    tr.run()
  assert stopped.value.step == 3 and not _rollout_threads()
  assert _saved_steps(wd) == [3]  # the graceful stop saved step 3
  logs = []
  resumed = make_trainer(cfg, wd, logs.append)
  resumed.run()
  assert not _rollout_threads()
  assert any("resumed from checkpoint step 3" in line for line in logs)
  _assert_same_runs(full, tmp_path / "async", resumed, wd, steps)
  _assert_same_params(resumed.final_state.params, sync.final_state.params)


# ---- faults ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_rollout_fault_is_raised_at_the_step_that_needed_the_batch(tmp_path, monkeypatch):
  # The third rollout fails: in the background, while step 2 updates, and handed to step 3, which raises
  # it, as the synchronous run raises it in step 3: steps 1 and 2 are done and saved.
  monkeypatch.setattr(faults, "_PLAN", {"rollout": (3, "raise")})
  monkeypatch.setattr(faults, "_COUNTS", {})
  wd = tmp_path / "run"
  with pytest.raises(RuntimeError, match=r"^injected failure at rollout #3$"):
    make_trainer(_cfg(1, True, **{"checkpoint.every_steps": 1}), wd, _quiet).run()
  assert not _rollout_threads()
  assert [r["step"] for r in _rows(wd)] == [1, 2]
  assert _saved_steps(wd)[-1] == 2


# ---- the queue itself, with a stand-in engine --------------------------------------------

class _Engine:
  """Records what it was synced with; `generate` returns (prompts, key), or raises at call `fail_at`."""

  def __init__(self, fail_at: int = 0):
    self.synced, self.calls, self.fail_at = [], 0, fail_at

  def sync(self, params, version):
    self.synced.append((params, version))

  def metrics(self):
    return {}

  def generate(self, prompts, key):
    self.calls += 1
    if self.calls == self.fail_at:
      raise RuntimeError("engine: the server does not answer")
    return prompts, key


class _Prompts:
  """A prompt pipeline drawing 0, 1, 2, ... with its position as state."""

  def __init__(self):
    self.n = 0

  def __next__(self):
    self.n += 1
    return self.n - 1

  def get_state(self):
    return {"n": self.n}


def _queue(k: int, steps: int, engine: _Engine, kind=AsyncRollouts):
  ctx = types.SimpleNamespace(cfg=types.SimpleNamespace(rollout=types.SimpleNamespace(staleness=k)), engine=engine,
                              pipeline=_Prompts(), mesh=jax.make_mesh((1,), ("data",), axis_types=(AxisType.Auto,),
                                                                devices=jax.devices()[:1]))
  state = types.SimpleNamespace(step=0, lag_params=tuple(f"lag{i}" for i in range(k)), key=jax.random.key(7))
  return kind(ctx, state, steps=steps)


def _wait(cond, timeout_s=30.0):
  deadline = time.monotonic() + timeout_s
  while not cond() and time.monotonic() < deadline:
    time.sleep(0.01)
  return cond()


def test_the_queue_runs_k_ahead_with_the_schedule_s_weights_keys_and_prompts():
  k, steps, engine = 2, 5, _Engine()
  q = _queue(k, steps, engine)
  try:
    # Only the lag buffer's k snapshots exist yet: k batches are made, no more.
    assert _wait(lambda: engine.calls == k)
    time.sleep(0.2)
    assert engine.calls == k and q.running
    key = jax.random.key(7)
    for s in range(steps):
      q.publish(f"theta{s}")  # the start of step s: theta_s is step s + k's weights
      gen, waited = q.take(s)
      key, k_sample = jax.random.split(key)
      prompts, used = gen.samples
      assert prompts == s and gen.data_state == {"n": s + 1} and waited >= 0.0
      assert np.array_equal(jax.random.key_data(used), jax.random.key_data(jax.random.fold_in(k_sample, 0)))
    # step s sampled with theta_{max(s - k, 0)}: the lag buffer's entries, then the published snapshots
    assert engine.synced == [("lag0", 0), ("lag1", 0), ("theta0", 0), ("theta1", 1), ("theta2", 2)]
    with pytest.raises(ValueError, match=r"take\(3\): the next batch is step 5's"):
      q.take(3)
    assert _wait(lambda: not q.running)  # all of them made: the thread has ended
  finally:
    q.close()


def test_the_queue_hands_an_error_to_the_step_that_needed_the_batch_and_closes_while_blocked():
  engine = _Engine(fail_at=3)
  q = _queue(1, 6, engine)
  try:
    for s in range(2):
      q.publish(f"theta{s}")
      q.take(s)
    q.publish("theta2")
    with pytest.raises(RuntimeError, match="^engine: the server does not answer$"):
      q.take(2)
    assert _wait(lambda: not q.running) and engine.calls == 3  # it stopped at the failure
  finally:
    q.close()
  blocked = _queue(2, 6, _Engine())  # makes two batches, then waits for weights that never come
  assert _wait(lambda: blocked._ready.full())
  blocked.close()
  assert not blocked.running and not _rollout_threads()


def test_the_inline_queue_makes_the_threaded_queue_s_batches_one_step_ahead_during_the_update():
  """InlineRollouts (several processes): nothing is made in the background; `take` makes a batch that
  was not made ahead, `while_updating` makes the next one; weights, keys and prompts as the thread's."""
  k, steps, engine = 2, 5, _Engine()
  q = _queue(k, steps, engine, kind=InlineRollouts)
  assert engine.calls == 0
  key = jax.random.key(7)
  for s in range(steps):
    q.publish(f"theta{s}")
    gen, _ = q.take(s)
    assert engine.calls == (1 if s == 0 else s + 1)  # step 0's batch made by take, the others ahead
    key, k_sample = jax.random.split(key)
    prompts, used = gen.samples
    assert prompts == s and gen.data_state == {"n": s + 1}
    assert np.array_equal(jax.random.key_data(used), jax.random.key_data(jax.random.fold_in(k_sample, 0)))
    q.while_updating()  # step s's updates are launched: step s + 1's batch is made now
    q.while_updating()  # once per step: a second call makes nothing
    assert engine.calls == min(s + 2, steps)
  assert engine.synced == [("lag0", 0), ("lag1", 0), ("theta0", 0), ("theta1", 1), ("theta2", 2)]  # the thread's
  assert not q.running
  with pytest.raises(ValueError, match=r"take\(3\): the next batch is step 5's"):
    q.take(3)


def test_the_inline_queue_hands_an_error_to_the_step_that_needed_the_batch():
  engine = _Engine(fail_at=3)
  q = _queue(1, 6, engine, kind=InlineRollouts)
  for s in range(2):
    q.publish(f"theta{s}")
    q.take(s)
    q.while_updating()  # step 2's batch fails here, during step 1's update: step 1 goes on
  q.publish("theta2")
  with pytest.raises(RuntimeError, match="^engine: the server does not answer$"):
    q.take(2)
  q.while_updating()
  assert engine.calls == 3 and not q.running  # nothing is made after the failure


# ---- the config key ------------------------------------------------------------------------

def test_the_overlap_key_is_validated_and_round_trips():
  cfg = _cfg(1, True)
  assert cfg.rollout.overlap is True and _cfg(1, False).rollout.overlap is False
  assert from_config_dict(plain_config(cfg)).rollout == cfg.rollout  # config.json reads back
  with pytest.raises(ConfigError, match=r"config.rollout.staleness=0 .*rollout.overlap=True .* use staleness >= 1"):
    _cfg(0, True)
  d = shrink(load_config("grpo")).to_dict()  # a dict: the locked ConfigDict would refuse the str itself
  d["rollout"]["overlap"] = "yes"
  with pytest.raises(ConfigError, match=r"config.rollout.overlap must be a bool, got 'yes'"):
    from_config_dict(d)
  with pytest.raises(ConfigError, match=r"config.filters.dynamic_sampling=True .*rollout.overlap"):
    _cfg(1, True, **{"filters.dynamic_sampling": True})


def _train_cli(tmp_path, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=ONE_DEVICE_XLA_FLAGS)
  return subprocess.run([sys.executable, "-m", "jaxrl_llm.train", *args, f"--workdir={tmp_path / 'run'}"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _errors(proc) -> list[str]:
  return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_the_command_line_sets_the_overlap_key(tmp_path):
  # The run's own check (staleness 0) answers, before any model is built.
  proc = _train_cli(tmp_path, "--config=configs/grpo.py", "--config.rollout.overlap=True")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "error: config.rollout.staleness=0 is invalid: rollout.overlap=True" in proc.stderr


@pytest.mark.parametrize("flag", ["--config.rollout.async=True", '--config.rollout["async"]=True'])
def test_the_old_async_key_on_the_command_line_names_the_new_one(tmp_path, flag):
  proc = _train_cli(tmp_path, "--config=configs/grpo.py", flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert _errors(proc) == ["error: config.rollout.async was renamed: use --config.rollout.overlap=True"]
  assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_old_async_key_in_a_config_file_names_the_new_one(tmp_path):
  path = tmp_path / "old_async.py"
  path.write_text("from jaxrl_llm.training.defaults import get_config as base\n\n\n"
                  "def get_config():\n  c = base('grpo')\n  c.rollout['async'] = True\n  return c\n")
  proc = _train_cli(tmp_path, f"--config={path}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert _errors(proc) == ["error: config.rollout.async was renamed: use config.rollout.overlap "
                           "(--config.rollout.overlap=... on the command line, c.rollout.overlap = ... in a "
                           "config file)"]
  assert "Traceback" not in proc.stderr


# ---- the openai engine ---------------------------------------------------------------------

@pytest.mark.slow
def test_async_through_the_openai_stand_in_with_sync_every_step(tmp_path):
  """The engine's server (the stand-in, started and restarted on a GGUF export by the engine) gets
  theta_{max(s-1, 0)} before step s's batch, in the background: versions 0, 0, 1, so two exports."""
  cfg = _cfg(1, True, **{"rollout.engine": "openai", "rollout.server.sync_every": 1,
                         "rollout.server.backoff_s": 0.01,
                         "rollout.server.command": f"{sys.executable} {fake_openai_server.__file__}",
                         "rollout.server.concurrency": 4, "train.steps": 3})
  tr = _run(cfg, tmp_path / "run")
  rows = _rows(tmp_path / "run")
  assert [r["rollout/version_lag_max"] for r in rows] == [0.0, 1.0, 1.0]
  assert [r["rollout/version_lag_min"] for r in rows] == [0.0, 1.0, 1.0]
  assert [r["engine/syncs"] for r in rows] == [1.0, 1.0, 2.0]  # sync_every 1: a new version, a new export
  assert rows[-1]["engine/dropped"] == 0.0 and all(np.isfinite(r["loss/total"]) for r in rows)
  assert not tr.engine.process.alive()  # closed with the run


class _TwoTurnEnv:
  """Whatever the policy writes: turn 0 is answered "<r>ok</r>", turn 1 ends the episode, correct when its
  text has an even length. A function of the episode's own turns: the same in any thread and order."""

  name, stop_strings = "two_turn", ()

  def reset(self, example):
    self.turns = 0
    return [{"role": "user", "content": example.prompt}]

  def step(self, turn, *, truncated=False):
    from jaxrl_llm.envs.base import Observation
    from jaxrl_llm.model.tokenizer import CharTokenizer

    self.turns += 1
    if self.turns == 1:
      return Observation(({"role": "tool", "content": "<r>ok</r>"},), {"correct": 0.0}, False, "tool_result")
    return Observation((), {"correct": float(len(CharTokenizer().decode(turn)) % 2 == 0)}, True, "answer")


@pytest.mark.slow
def test_episodes_generated_in_the_background_equal_the_synchronous_run(tmp_path, monkeypatch):
  from jaxrl_llm.envs import registry

  monkeypatch.setattr(registry, "_ENVS", dict(registry._ENVS))
  registry.register_env("two_turn", lambda cfg, task, pool, tok: _TwoTurnEnv())
  env = {"env.name": "two_turn", "env.max_turns": 3, "env.max_turn_tokens": 6, "env.max_tokens": 40}
  sync = _run(_cfg(1, False, **env), tmp_path / "sync")
  asyn = _run(_cfg(1, True, **env), tmp_path / "async")
  _assert_same_runs(sync, tmp_path / "sync", asyn, tmp_path / "async", 3)
  _assert_version_lag(tmp_path / "async", 1)
  assert all(r["env/turns_mean"] == 2.0 for r in _rows(tmp_path / "async"))
