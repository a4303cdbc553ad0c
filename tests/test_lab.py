"""The method lab (python -m jaxrl_llm.lab): the grid's runs, resume after a kill, failures,
the shared warm start, results against the cells' own files, plots, and bad input.

A 1 method x 1 mismatch x 2 seeds grid of a tiny model is run once for the module
(killed after its first finished cell and rerun); the tests read it. The runs are
subprocesses of the CLI on one CPU device (the fake 8-device mesh of conftest.py is
for in-process tests; here it would only slow each run down).

Its size is the least that every test below needs: two seeds (a warm start each, an
aggregate with a standard deviation), one run at a time (the kill then always finds a
cell done and the next one started, and no program is compiled by two runs at once;
the failing-cell test runs two at a time), and the lab's own compilation cache
(<out>/compile_cache, every program cached), shared by the cells as a user's sweep
shares it. Most of a tiny cell's time is its process (imports, tracing, the cached
programs' loading), not its steps: each cell left out is one process less. A grid
of several methods is the failing-cell test's.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from run_helpers import ONE_DEVICE_XLA_FLAGS

from jaxrl_llm.lab import grid, results, runner

METHODS, MISMATCHES, SEEDS, STEPS = "grpo", "int4", "2", 4
TINY_BASE = textwrap.dedent("""
    from jaxrl_llm.training.defaults import get_config as _base

    def get_config():
      c = _base("grpo")
      c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.n_kv_heads, c.model.d_ff = 32, 1, 2, 1, 64
      c.task.digits = 1  # 1-digit + 1-digit: 150 SFT steps reach a few correct answers
      c.sft.steps, c.sft.batch_size, c.sft.warmup_steps, c.sft.lr = 150, 64, 5, 3e-3
      c.rollout.prompts_per_step, c.rollout.group_size, c.rollout.max_response_len = 8, 4, 5
      c.eval.n_examples = 16
      c.task.n_train = 256
      return c
""")


def _env(cache=None):
  env = dict(os.environ)
  env["XLA_FLAGS"] = ONE_DEVICE_XLA_FLAGS
  env["JAX_PLATFORMS"] = "cpu"
  # The lab's default cache, <out>/compile_cache with every program in it (runner.child_env), not the
  # suite's, which skips programs compiled in under 0.3 s: a tiny cell's are, and it compiled them again.
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
  if cache:  # another sweep's: a program's cache key holds the cache's own path, so a copied cache is cold
    env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return env


def _lab_argv(out, base, methods=METHODS, mismatches=MISMATCHES, seeds=SEEDS, jobs=1, extra=()):
  return [sys.executable, "-m", "jaxrl_llm.lab", f"--methods={methods}", f"--mismatch={mismatches}",
          f"--seeds={seeds}", f"--steps={STEPS}", f"--out={out}", f"--jobs={jobs}", f"--config={base}",
          "--eval-every=2", *extra]


def _events(out):
  with open(os.path.join(out, runner.LAB_LOG)) as f:
    return [json.loads(line) for line in f if line.strip()]


def _sweeps(out):
  """The lab log's rows split by sweep (one list per lab process)."""
  runs = []
  for e in _events(out):
    if e["event"] == "sweep":
      runs.append([])
    runs[-1].append(e)
  return runs


# The grid runs once: the module's tests go to one pytest-xdist worker, and its fixtures are that
# worker's for the session (a module-scoped one is set up again wherever the worker runs another
# module's test between two of this one's).
pytestmark = pytest.mark.xdist_group("test_lab")


@pytest.fixture(scope="session")
def base_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("lab_base") / "tiny.py"
  path.write_text(TINY_BASE)
  return str(path)


@pytest.fixture(scope="session")
def grid_dir(tmp_path_factory, base_file):
  """The grid, SIGKILLed (lab and runs) once its first cell is done and a later run has started (so
  the kill always lands mid-run: one run at a time, the next starts as the cell ends), then rerun to
  the end."""
  out = str(tmp_path_factory.mktemp("lab") / "sweep")
  proc = subprocess.Popen(_lab_argv(out, base_file), env=_env(), start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 600
  first_done = None
  while time.time() < deadline and proc.poll() is None:
    time.sleep(0.3)
    if os.path.exists(os.path.join(out, runner.LAB_LOG)):
      events = _events(out)
      done = [e["run"] for e in events if e["event"] == "done" and not e["run"].startswith("warm_start")]
      running = {e["run"] for e in events if e["event"] == "start"} - {e["run"] for e in events if e["event"] == "done"}
      if done and running:
        first_done = done
        break
  assert first_done, proc.communicate()[0].decode()[-3000:]
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  time.sleep(0.5)
  done_before = {e["run"] for e in _events(out) if e["event"] == "done"}
  mtimes = {c: os.path.getmtime(os.path.join(out, "cells", c, "summary.json")) for c in done_before
            if not c.startswith("warm_start")}
  rerun = subprocess.run(_lab_argv(out, base_file), env=_env(), capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  with open(os.path.join(out, "results.json")) as f:
    res = json.load(f)
  return {"out": out, "done_before": done_before, "mtimes": mtimes, "results": res, "stdout": rerun.stdout}


def _cell_files(out, name):
  wd = os.path.join(out, "cells", name)
  with open(os.path.join(wd, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return summary, rows


@pytest.mark.slow
def test_kill_mid_grid_then_rerun_runs_only_the_missing_cells(grid_dir, base_file):
  out, res = grid_dir["out"], grid_dir["results"]
  names = {c["name"] for c in res["cells"]}
  assert len(names) == 2 and res["counts"] == {"done": 2, "failed": 0, "missing": 0}
  first, second = _sweeps(out)
  started_again = {e["run"] for e in second if e["event"] == "start"}
  # Everything not finished before the kill ran again, and nothing that had finished.
  assert started_again == (names | {"warm_start/s0", "warm_start/s1"}) - grid_dir["done_before"]
  assert started_again and not started_again & grid_dir["done_before"]
  for name, mtime in grid_dir["mtimes"].items():
    assert os.path.getmtime(os.path.join(out, "cells", name, "summary.json")) == mtime
  # The killed sweep recorded no end for the runs it was running: they are the ones that ran again.
  killed = {e["run"] for e in first if e["event"] == "start"} - grid_dir["done_before"]
  assert killed and killed <= started_again
  # A third run of the same command finds nothing to do.
  again = subprocess.run(_lab_argv(out, base_file), env=_env(), capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr
  assert "0 to run, 4 already recorded" in again.stdout
  assert not [e for e in _sweeps(out)[-1] if e["event"] == "start"]


def test_results_equal_the_cells_own_files(grid_dir):
  out, res = grid_dir["out"], grid_dir["results"]
  by_name = {c["name"]: c for c in res["cells"]}
  for name, c in by_name.items():
    summary, rows = _cell_files(out, name)
    n = c["numbers"]
    assert n["acc_start"] == summary["eval_accuracy_start"] and n["acc_end"] == summary["eval_accuracy_end"]
    rewards = [r["reward/mean"] for r in rows]
    assert len(rewards) == STEPS and [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert n["auc"] == pytest.approx(sum(rewards) / STEPS, abs=1e-12)
    # eval.every=2 over 4 steps: start, step 2, end.
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    assert [s for s, _ in evals] == [2]
    assert n["eval_curve"] == [[0, summary["eval_accuracy_start"]], [2, evals[0][1]], [STEPS, summary["eval_accuracy_end"]]]
    if "int4" in name:  # the quantised sampler's mismatch is measured; none has no recompute of pi_prox
      logc = [r["mismatch/log_c_abs_mean"] for r in rows]
      assert n["log_c_abs"] == pytest.approx(np.mean(logc), abs=1e-12) and n["log_c_abs"] > 0
  # The aggregate of each (method, mismatch) over its two seeds, recomputed from the files.
  for g in res["groups"]:
    names = [f"{grid.slug(g['method'])}__{grid.slug(g['mismatch'])}__s{s}" for s in (0, 1)]
    acc = [_cell_files(out, nm)[0]["eval_accuracy_end"] for nm in names]
    auc = [np.mean([r["reward/mean"] for r in _cell_files(out, nm)[1]]) for nm in names]
    a = g["aggregate"]
    assert a["acc_end"]["mean"] == pytest.approx(np.mean(acc), abs=1e-12)
    assert a["acc_end"]["std"] == pytest.approx(np.std(acc, ddof=1), abs=1e-12)
    assert (a["acc_end"]["min"], a["acc_end"]["max"]) == (min(acc), max(acc))
    assert a["auc"]["mean"] == pytest.approx(np.mean(auc), abs=1e-12)
    assert a["done"] == 2
  md = open(os.path.join(out, "results.md")).read()
  assert all(f"| {g['method']} | {g['mismatch']} |" in md for g in res["groups"])


def test_every_cell_starts_from_its_seeds_warm_start(grid_dir):
  out, res = grid_dir["out"], grid_dir["results"]
  for seed in (0, 1):
    wd = os.path.join(out, "warm_start", f"s{seed}")
    with open(os.path.join(wd, "summary.json")) as f:
      warm = json.load(f)
    assert warm["rl_steps"] == 0 and warm["sft_steps"] == 150
    fingerprint = runner.checkpoint_fingerprint(wd)  # its params, unchanged by the cells
    assert res["warm_starts"][f"s{seed}"]["fingerprint"] == fingerprint
    cells = [c for c in res["cells"] if c["seed"] == seed]
    assert len(cells) == len(METHODS.split(","))
    for c in cells:
      assert c["warm_start"] == {"run": f"warm_start/s{seed}", "fingerprint": fingerprint}
      # The same params, greedy on the same held-out set: the same start accuracy as the warm start's.
      assert c["numbers"]["acc_start"] == warm["eval_accuracy_end"]
      log = open(os.path.join(out, c["workdir"], runner.RUN_LOG)).read()
      assert f"init_checkpoint: params from step 0 of {wd}/checkpoints" in log
      assert c["overrides"]["config.sft.steps"] == "0" and c["overrides"]["config.seed"] == str(seed)
  # The seeds differ: their warm starts are not the same params.
  assert res["warm_starts"]["s0"]["fingerprint"] != res["warm_starts"]["s1"]["fingerprint"]


def test_plots_exist_and_are_not_blank(grid_dir):
  import matplotlib.image as mpimg

  out = grid_dir["out"]
  paths = [os.path.join(out, "heatmap.png")] + [os.path.join(out, "curves_int4.png")]
  assert sorted(grid_dir["results"]["plots"]["curves"]) == ["curves_int4.png"]
  for p in paths:
    img = mpimg.imread(p)[..., :3]
    assert img.shape[0] > 150 and img.shape[1] > 300  # the heatmap of one method x one mismatch: 315 x 175
    assert img.std() > 0.05, p  # a blank (single-colour) image has std 0
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50, p


@pytest.mark.slow
def test_a_failing_cell_is_recorded_and_the_others_finish(grid_dir, base_file, tmp_path):
  """A method the trainer refuses added to the sweep: its cells fail, the sweep goes on and the cell
  still to run finishes after them. That cell is the grid's grpo/int4/s1, its folder deleted (what the
  lab tells a user to do to rerun a cell): its programs are in the grid's compilation cache, where a
  cell of a new mismatch would compile every one of its own."""
  out = str(tmp_path / "sweep")
  # The warm starts and grpo/int4/s0 are reused; the runs use the grid's cache, not a copy.
  shutil.copytree(grid_dir["out"], out, ignore=shutil.ignore_patterns("compile_cache"))
  shutil.rmtree(os.path.join(out, "cells", "grpo__int4__s1"))
  argv = _lab_argv(out, base_file, methods="grpo@eps_low=-1,grpo", mismatches="int4", seeds="2", jobs=2)
  env = _env(cache=os.path.join(grid_dir["out"], "compile_cache"))
  proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
  with open(os.path.join(out, "results.json")) as f:
    res = json.load(f)
  status = {c["name"]: c for c in res["cells"]}
  assert {n: c["status"] for n, c in status.items()} == {
      "grpo__int4__s0": "done", "grpo@eps_low=-1__int4__s0": "failed",
      "grpo__int4__s1": "done", "grpo@eps_low=-1__int4__s1": "failed"}
  for name in ("grpo@eps_low=-1__int4__s0", "grpo@eps_low=-1__int4__s1"):
    assert status[name]["returncode"] == 2
    assert status[name]["error"].startswith("error: config.objective: ObjectiveConfig.eps_low=-1.0 is invalid")
  started = [e["run"] for e in _sweeps(out)[-1] if e["event"] == "start"]
  # Only the cells without a record ran (the copied warm starts and grpo/int4/s0 were reused), and
  # grpo/int4/s1 ran after the two failures (two runs at a time: the failing ones first, in grid order).
  assert started == ["grpo@eps_low=-1__int4__s0", "grpo@eps_low=-1__int4__s1", "grpo__int4__s1"]
  ended = [e["run"] for e in _sweeps(out)[-1] if e["event"] in ("done", "failed")]
  assert ended[-1] == "grpo__int4__s1" and status["grpo__int4__s1"]["numbers"]["rl_steps"] == STEPS
  md = open(os.path.join(out, "results.md")).read()
  assert "## Failed cells" in md and "ObjectiveConfig.eps_low" in md


def test_a_changed_base_config_in_the_same_out_is_refused(grid_dir, base_file):
  proc = subprocess.run(_lab_argv(grid_dir["out"], base_file, extra=["--config.train.lr=0.001"]), env=_env(),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ")
  assert "warm_start/s0 was run with other settings" in lines[0] and "config.train.lr" in lines[0]


@pytest.mark.parametrize("flag,expected", [
    ("--methods=grpo,icepopp", "--methods='icepopp' is invalid"),
    ("--mismatch=none,int3", "--mismatch='int3' is invalid: unknown part 'int3'"),
    ("--mismatch=noise:1.5", "'noise:1.5' needs in (0.0, 1.0]"),
    ("--mismatch=stale:0", "'stale:0' needs an integer >= 1"),
    ("--config.seed=4", "--config.seed='4' is invalid: the lab sets it: use --seeds"),
    ("--config.rollout.server_url=http://h:1",
     "config.rollout.server_url was renamed: use --config.rollout.server.url=http://h:1"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, flag, expected):
  argv = [sys.executable, "-m", "jaxrl_llm.lab", "--methods=grpo", "--mismatch=none", "--steps=3",
          f"--out={tmp_path / 'o'}", flag]
  proc = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
  if "--methods" in flag:
    assert "'icepop'" in lines[0] and "'token_tis'" in lines[0]  # the allowed presets are named
  assert not os.path.exists(tmp_path / "o")


def test_a_multiprocess_launch_is_one_line_and_status_2(tmp_path):
  """The lab's cells are processes of their own: launched with a multi-process run's variables, it says so
  (every process would start every cell) and starts nothing."""
  argv = [sys.executable, "-m", "jaxrl_llm.lab", "--methods=grpo", "--mismatch=none", "--steps=3",
          f"--out={tmp_path / 'o'}"]
  proc = subprocess.run(argv, env={**_env(), "JAX_NUM_PROCESSES": "2"}, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  (line,) = proc.stderr.strip().splitlines()
  assert line.startswith("error: python -m jaxrl_llm.lab runs as one process") and "JAX_NUM_PROCESSES=2" in line
  assert not os.path.exists(tmp_path / "o")


# ---- the pieces, against hand-computed values ---------------------------------------------
def test_mismatch_tokens_map_to_the_rollout_keys():
  assert grid.parse_mismatch("none").settings == ()
  assert dict(grid.parse_mismatch("bf16").settings) == {"rollout.sampler_dtype": "bfloat16"}
  assert dict(grid.parse_mismatch("int4:128+stale:1").settings) == {
      "rollout.mismatch.quant": "int4", "rollout.mismatch.quant_group": "128", "rollout.staleness": "1"}
  assert dict(grid.parse_mismatch("noise:0.2+bf16").settings) == {"rollout.mismatch.noise": "0.2",
                                                                  "rollout.sampler_dtype": "bfloat16"}
  m = grid.parse_method("icepop@band_high=2@rollout.temperature=0.7", ("grpo", "icepop"))
  assert (m.preset, m.overrides) == ("icepop", (("objective.band_high", "2"), ("rollout.temperature", "0.7")))
  assert grid.parse_seeds("3") == (0, 1, 2) and grid.parse_seeds("0,5") == (0, 5)
  assert grid.slug("noise:0.05") == "noise-0.05"


def test_base_file_changes_become_flags_outside_the_objective(base_file):
  method, flags = grid.base_overrides(base_file, grid.default_configs_dir())
  assert method == "grpo"
  assert flags == {"model.d_model": "32", "model.n_layers": "1", "model.n_heads": "2", "model.n_kv_heads": "1",
                   "model.d_ff": "64", "task.digits": "1", "sft.steps": "150", "sft.batch_size": "64",
                   "sft.warmup_steps": "5", "sft.lr": "0.003",
                   "rollout.prompts_per_step": "8", "rollout.group_size": "4", "rollout.max_response_len": "5",
                   "eval.n_examples": "16", "task.n_train": "256"}
  assert grid.flag_value(True) == "true" and grid.flag_value((1, 50)) == "(1, 50)" and grid.flag_value(3e-4) == "0.0003"


def _fake_cell(wd, rewards, kl=None, skipped=(), evals=None):
  wd.mkdir()
  with open(wd / "metrics.jsonl", "w") as f:
    for t, r in enumerate(rewards, 1):
      row = {"step": t, "reward/mean": r, "update/skipped_nonfinite": 1.0 if t in skipped else 0.0,
             "trust/clip_frac": 0.1 * t, "correction/masked_frac": 0.0, "mismatch/log_c_abs_mean": 0.01 * t}
      if kl is not None:
        row["kl/ref"] = kl[t - 1]
      if evals and t in evals:
        row["eval/accuracy"] = evals[t]
      f.write(json.dumps(row) + "\n")
  (wd / "summary.json").write_text(json.dumps({"eval_accuracy_start": 0.25, "eval_accuracy_end": 0.5,
                                               "eval_gain": 0.25, "rl_steps": len(rewards)}))
  return str(wd)


def test_cell_numbers_by_hand(tmp_path):
  crit = results.Criteria(target=0.6, drop=0.3, kl_bound=0.5, smooth=2)
  # rewards 0.2 0.6 0.8 0.4 0.1; trailing mean over 2: 0.2 0.4 0.7 0.6 0.25 -> reaches 0.6 at step 3;
  # running best 0.2 0.4 0.7 0.7 0.7 -> best - now: 0 0 0 0.1 0.45 > 0.3 first at step 5.
  # kl/ref 0 0.1 0.2 0.6 0.9, trailing mean over 2: 0 0.05 0.15 0.4 0.75 -> above 0.5 first at step 5.
  wd = _fake_cell(tmp_path / "a", [0.2, 0.6, 0.8, 0.4, 0.1], kl=[0.0, 0.1, 0.2, 0.6, 0.9], skipped=(4,), evals={2: 0.375})
  n = results.cell_numbers(wd, crit)
  assert n["auc"] == pytest.approx((0.2 + 0.6 + 0.8 + 0.4 + 0.1) / 5)
  assert n["steps_to_target"] == 3
  assert n["collapse"] == {"reward_drop": 5, "nonfinite": 4, "kl": 5}
  assert n["eval_curve"] == [[0, 0.25], [2, 0.375], [5, 0.5]]
  assert n["fractions"]["trust/clip_frac"] == pytest.approx(0.3)  # mean of 0.1 .. 0.5
  assert n["log_c_abs"] == pytest.approx(0.03)
  assert n["kl_max"] == 0.9
  # Never reaching the target, no collapse: None and {}.
  n = results.cell_numbers(_fake_cell(tmp_path / "b", [0.3, 0.35]), crit)
  assert n["steps_to_target"] is None and n["collapse"] == {}
  agg = results.aggregate_seeds([{"status": "done", "numbers": {**n, "acc_end": a}} for a in (0.5, 0.7, 0.9)]
                          + [{"status": "failed"}])
  assert agg["acc_end"] == {"mean": pytest.approx(0.7), "std": pytest.approx(0.2), "min": 0.5, "max": 0.9, "n": 3}
  assert (agg["done"], agg["failed"], agg["seeds"], agg["collapses"]) == (3, 1, 4, 0)


def test_the_clip_column_adds_the_corrections_clips():
  """ScaleRL-style presets clip rho in the correction (correction/clip_*), not r in the trust region."""
  assert results._clipped({"trust/clip_frac": 0.1, "correction/clip_low_frac": 0.02,
                           "correction/clip_high_frac": 0.05}) == pytest.approx(0.17)
  assert results._clipped({"correction/clip_high_frac": 0.05}) == pytest.approx(0.05)
  assert results._clipped({"correction/masked_frac": 0.3}) is None
