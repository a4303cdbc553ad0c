"""Acceptance: SIGKILL a training run after a checkpoint, rerun the same command,
and get exactly the uninterrupted run's final params and metrics.jsonl; the
report PNG exists; `evaluate` reproduces the logged end-of-run accuracy.

Timing fields (`time/*`, `perf/tokens_per_s`) are excluded from the metrics
comparison: they measure the wall clock, not the computation.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS

from jaxrl_llm.training.tiny import WARM_TINY_RUN, config_flags

STEPS = 4
# A tiny model, warm-started enough that rewards vary within groups (1-digit
# sums, a format bonus): the RL updates move the params, so equality is a test.
# Seed 4: with the suite's XLA:CPU flags (run_helpers.CHEAP_XLA_FLAGS) the
# tiny run's default seed, 3, draws a step 3 whose groups all tie (grad norm
# 0); seed 4's four steps all update (grad norms 0.51, 0.50, 0.28, 0.71).
FLAGS = ["--config=configs/gspo.py", *config_flags({**WARM_TINY_RUN, "train.steps": STEPS, "seed": 4})]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMING = ("time/", "perf/tokens_per_s")


def env(cache_dir):
  e = dict(os.environ)
  # Later processes reuse the first one's compiled programs (same programs,
  # same results; it only saves compile time).
  e.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
           JAX_PLATFORMS="cpu", XLA_FLAGS=ONE_DEVICE_XLA_FLAGS)
  return e


def train_cmd(workdir):
  return [sys.executable, "-m", "jaxrl_llm.train", *FLAGS, f"--workdir={workdir}"]


def run(cmd, cache_dir):
  proc = subprocess.run(cmd, cwd=REPO, env=env(cache_dir), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def final_params(workdir):
  """The params saved at the final step, as numpy (read straight from Orbax)."""
  state = ocp.PyTreeCheckpointer().restore(os.path.join(workdir, "checkpoints", str(STEPS), "state"))
  return state["params"]


def metric_rows(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


@pytest.mark.slow
def test_kill_after_checkpoint_then_resume_is_exact(tmp_path):
  cache = tmp_path / "jax_cache"
  full, killed = tmp_path / "full", tmp_path / "killed"
  run(train_cmd(full), cache)

  # Start the same run elsewhere and SIGKILL it once step 2 is committed.
  proc = subprocess.Popen(train_cmd(killed), cwd=REPO, env=env(cache),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  step2 = killed / "checkpoints" / "2"
  deadline = time.time() + 600
  while not step2.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  saved = sorted(int(d) for d in os.listdir(killed / "checkpoints") if d.isdigit())
  assert proc.returncode == -signal.SIGKILL, (proc.returncode, saved)
  assert not (killed / "summary.json").exists(), f"the run ended before the kill: {saved}"
  assert saved and max(saved) < STEPS, saved

  out = run(train_cmd(killed), cache).stdout
  assert "resumed from checkpoint step" in out
  # Same resolved config in both runs (a default edited between them would
  # make the comparison below meaningless).
  assert json.load(open(full / "config.json")) == json.load(open(killed / "config.json"))

  a, b = final_params(full), final_params(killed)
  flat_a, flat_b = (dict(ocp.tree.to_flat_dict(x)) for x in (a, b))
  assert flat_a.keys() == flat_b.keys()
  for k in flat_a:
    np.testing.assert_array_equal(flat_a[k], flat_b[k], err_msg=str(k))
  rows_a, rows_b = metric_rows(full), metric_rows(killed)
  assert [r["step"] for r in rows_a] == list(range(1, STEPS + 1))
  assert all(r["grad/norm"] > 0 for r in rows_a)  # every step really updated the params
  assert rows_a == rows_b
  sa = json.load(open(full / "summary.json"))
  sb = json.load(open(killed / "summary.json"))
  for k in ("eval_accuracy_start", "eval_accuracy_end", "train_reward_first",
            "train_reward_last", "rl_steps"):
    assert sa[k] == sb[k], k
  for w in (full, killed):
    png = w / "report.png"
    assert png.exists() and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"

  # `evaluate` over every saved step (a curve): the final step reproduces the
  # greedy accuracy and response length the trainer logged at the end.
  run([sys.executable, "-m", "jaxrl_llm.evaluate", f"--workdir={full}", "--all_steps"], cache)
  ev = json.load(open(full / "eval" / "curve.json"))["steps"]
  assert sorted(ev, key=int) == ["2", str(STEPS)]
  assert ev[str(STEPS)]["pass@1_greedy"] == sa["eval_accuracy_end"]
  assert ev[str(STEPS)]["mean_response_length"] == sa["eval_response_length_end"]
