"""The reliability matrix's bitwise-resume rows (scripts/fault_matrix.py runs them all for
docs/reliability.md), run through the script's own functions:

* SIGKILL in a rollout and SIGTERM in an update of the matrix's run, its flags as they are;
* SIGKILL with the asynchronous state in flight: batches queued by the background generation and
  samples in the continuous batcher's slots (the matrix's row as it is), and multi-turn episodes with
  their tool workers mid-way (the matrix's row on the tiny model: EPISODES below).

Each killed or stopped run is rerun with the same command and must end with its uninterrupted
reference's final params and metrics.jsonl, bit for bit. Each reference's params still change after
step 4, the latest point a row resumes from, so that the params' equality is a test for every row.

The runs are one-device subprocesses with the suite's cheap XLA:CPU passes (a row's runs and its
reference are compiled alike) and the suite's compilation cache, where the script starts a cold one
of its own: most of a tiny run's time is its process (imports, tracing, loading the compiled
programs), and a program compiled once serves every later run. The two tests share the tiny run's
warm start and evaluation programs, so they run on one worker, one after the other.
"""

import importlib.util
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS, REPO

from jaxrl_llm.training.tiny import TINY_MODEL, config_flags

pytestmark = pytest.mark.xdist_group("fault_matrix")


def _script():
  spec = importlib.util.spec_from_file_location("fault_matrix", os.path.join(REPO, "scripts", "fault_matrix.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


fm = _script()

# The matrix's episodes row runs configs/examples/arithmetic_calculator.py's default model (D 128, 4
# layers), whose 80-step warm start is most of that row's time. The tiny model learns the calculator's
# call format in the same 80 steps: its steps have episodes that call the tool and take a second round
# (env.max_turns = 2), so round 5 is step 3's first, after step 2's checkpoint, with episodes and their
# tool calls mid-way (the test checks where it lands on the reference's metrics). Its answers are rarely
# right: the format bonus gives its groups rewards that differ, so that most steps update the params
# (steps 3, 5 and 6 after the resume point; without the bonus only steps 5 and 6, as in the matrix's row).
EPISODES = [*fm.EPISODES, *config_flags({**TINY_MODEL, "data.format_weight": 0.5})]


def _round_is_followed_in_its_step(turns_per_step, n):
  """Whether the n-th round of environment steps has another after it in the same RL step: a step plays
  2 rounds when an episode called the tool (mean turns over 1), else 1."""
  played = 0
  for turns in turns_per_step:
    played += 2 if turns > 1 else 1
    if played >= n:
      return played > n
  return False


@pytest.fixture
def matrix(tmp_path, monkeypatch):
  """(folder of the runs, compilation cache): the suite's cache, else one of this test's."""
  monkeypatch.setattr(fm, "XLA_FLAGS", ONE_DEVICE_XLA_FLAGS)
  return str(tmp_path), os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path / "jax_cache")


def _reference(tmp, cache, name, base=fm.FLAGS, extra=()):
  """An uninterrupted run; its params after step 4 (the latest resume point of the rows) and at the
  end differ."""
  ref = os.path.join(tmp, name)
  proc = fm.train(ref, cache, extra=extra, base=base)
  assert proc.returncode == 0, proc.stderr[-3000:]
  step4 = ocp.PyTreeCheckpointer().restore(os.path.join(ref, "checkpoints", "4", "state"))["params"]
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(step4), jax.tree.leaves(fm.final_params(ref)))), ref
  return ref


def _row(name):
  (row,) = [r for r in fm.ASYNC_ROWS if r[0] == name]
  return row


@pytest.mark.slow
def test_kill_and_sigterm_rows_lose_nothing(matrix):
  tmp, cache = matrix
  ref = _reference(tmp, cache, "reference")
  rows = [fm.run_kill("kill_rollout_5", "rollout:5:kill", ref, tmp, cache),
          fm.run_then_rerun("sigterm", "update:3:term", "SIGTERM during step 3's update", ref, tmp, cache,
                            expect_rc=143)]
  for r in rows:
    assert not r["lost"] and r["check"] == "final params and metrics bitwise equal", r
  assert rows[0]["run"] == "killed (rc -9); rerun rc 0, resumed from a checkpoint", rows[0]
  assert rows[1]["run"].startswith("rc 143 (stopped by SIGTERM after step 3") and \
      rows[1]["run"].endswith("; rerun rc 0"), rows[1]


@pytest.mark.slow
def test_kills_with_the_asynchronous_state_in_flight_lose_nothing(matrix):
  """SIGKILL with batches queued by the background generation (overlap, staleness 2) and samples in the
  continuous batcher's slots, and with multi-turn episodes and their tool workers mid-way: each rerun
  resumes from a checkpoint and ends with its own uninterrupted run's params and metrics, bit for bit."""
  tmp, cache = matrix
  # (the matrix's third such row, async_kill_update_5, kills the same run in an update: the script runs it)
  name, variant, fault = _row("async_kill_decode_chunk_22")
  base, extra = fm.VARIANTS[variant]
  rows = [fm.run_kill(name, fault, _reference(tmp, cache, "reference_async", base, extra), tmp, cache, base, extra)]
  name, variant, fault = _row("episodes_kill_episode_round_5")
  assert variant == "episodes"
  ref = _reference(tmp, cache, "reference_episodes", EPISODES)
  with open(os.path.join(ref, "metrics.jsonl")) as f:
    turns = [json.loads(line)["env/turns_mean"] for line in f if line.strip()]
  assert len(turns) == fm.STEPS and _round_is_followed_in_its_step(turns, int(fault.split(":")[1])), turns
  rows.append(fm.run_kill(name, fault, ref, tmp, cache, EPISODES))
  for r in rows:
    assert r["run"] == "killed (rc -9); rerun rc 0, resumed from a checkpoint", r
    assert not r["lost"] and r["check"] == "final params and metrics bitwise equal", r
