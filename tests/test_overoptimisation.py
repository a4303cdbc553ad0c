"""scripts/overoptimisation.py's reading of the lab's cells: the per-step means over seeds, the
summary numbers and the method specs it hands the lab (the sweep itself is a measurement, not a test)."""

import importlib.util
import json
import os

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
  path = os.path.join(REPO, "scripts", "overoptimisation.py")
  spec = importlib.util.spec_from_file_location("overoptimisation", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _cell(root, name, kl, noise, seed, rows, status="done"):
  d = root / "lab" / "cells" / name
  d.mkdir(parents=True)
  spec = {"config.objective.kl_coef": str(kl), "config.data.reward_model": f"/x/rm/noise{noise:g}",
          "config.seed": str(seed)}
  (d / "lab_status.json").write_text(json.dumps({"status": status, "spec": spec}))
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_curves_are_the_seeds_means_per_step(tmp_path):
  mod = _script()
  gold = [[0.2, 0.6, 0.9, 0.5, 0.3, 0.1, 0.1, 0.1], [0.4, 0.8, 0.7, 0.7, 0.5, 0.3, 0.1, 0.1]]
  for seed, g in enumerate(gold):
    rows = [{"step": t + 1, "kl/ref": 0.1 * t * (seed + 1), "reward/model_mean": float(t + seed),
             "reward/accuracy": g[t], **({"eval/accuracy": 0.5 + 0.1 * seed - 0.05 * t} if t in (0, 7) else {})}
            for t in range(8)]
    _cell(tmp_path, f"c{seed}", 0.05, 0.3, seed, rows)
  _cell(tmp_path, "failed", 0.05, 0.3, 9, [], status="failed")  # skipped
  (g,) = mod.curves(mod.read_cells(str(tmp_path)))
  assert (g["noise"], g["kl_coef"], g["seeds"], g["steps"]) == (0.3, 0.05, [0, 1], 8)
  np.testing.assert_allclose(g["kl_mean"], [0.15 * t for t in range(8)])
  np.testing.assert_allclose(g["proxy_mean"], [t + 0.5 for t in range(8)])
  np.testing.assert_allclose(g["gold_mean"], np.mean(gold, axis=0))
  assert g["eval_steps"] == [1, 8] and g["eval_start"] == [0.5, 0.6] and g["eval_end"] == pytest.approx([0.15, 0.25])
  # gold mean per step: .3 .7 .8 .6 .4 .2 .1 .1; a moving mean over 8 // 8 = 1 step: the peak is step 3
  assert g["gold_window"] == 1 and g["gold_smoothed_peak_step"] == 3
  assert g["gold_smoothed_peak"] == pytest.approx(0.8) and g["gold_smoothed_end"] == pytest.approx(0.1)
  assert g["kl_end"] == pytest.approx([0.7, 1.4]) and g["proxy_end"] == [7.0, 8.0]


def test_method_specs_parse_in_the_lab():
  from jaxrl_llm.lab.grid import parse_method, preset_names

  mod = _script()
  spec = parse_method(mod.method(0.05, 0.3, "/runs/o"), preset_names(os.path.join(REPO, "configs")))
  assert dict(spec.overrides) == {"objective.kl_coef": "0.05", "objective.kl_placement": "reward",
                                  "objective.kl_estimator": "k1", "data.reward_model": "/runs/o/rm/noise0.3"}


def test_gold_shape_tells_a_rise_and_fall_from_a_fall():
  oo = _script()
  # Smoothed gold accuracy per step: margins of 0.03 (SHAPE_MARGIN).
  assert oo.gold_shape(np.array([0.50, 0.60, 0.70, 0.55])) == "rise_then_fall"
  # Largest at the first window and falling after it: the shape five of six arms had, not a peak.
  assert oo.gold_shape(np.array([0.70, 0.66, 0.60, 0.52])) == "fall"
  assert oo.gold_shape(np.array([0.50, 0.60, 0.70, 0.69])) == "rise"
  assert oo.gold_shape(np.array([0.60, 0.62, 0.61, 0.60])) == "flat"
  # A rise within the noise then a fall is a fall.
  assert oo.gold_shape(np.array([0.60, 0.62, 0.50])) == "fall"



def test_a_reward_model_that_learned_nothing_stops_the_sweep_in_one_line(tmp_path, monkeypatch):
  """The reward-model stage passes --rm-seed to each run, and a model whose held-out pairwise accuracy
  ends at or below MIN_RM_ACCURACY stops the script with one line naming it (the runs stubbed: each
  writes the summary a finished run writes)."""
  mod = _script()
  calls = []

  def run(cmd, cwd, check):
    calls.append(cmd)
    workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    noise = float(next(a.split("=", 1)[1] for a in cmd if a.startswith("--config.data.label_noise=")))
    os.makedirs(workdir)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"eval_accuracy_end": 0.99 if noise == 0 else 0.48, "label_noise": noise}, f)

  monkeypatch.setattr(mod.subprocess, "run", run)
  with pytest.raises(SystemExit) as e:
    mod.train_reward_models(str(tmp_path), [0.0, 0.3], 400, seed=1)
  assert len(calls) == 2 and all("--config.seed=1" in c for c in calls)
  msg = str(e.value.code)
  assert msg.startswith("error: the reward model at label noise 0.3 (seed 1,") and "accuracy 0.480" in msg
  assert "\n" not in msg and "--rm-seed" in msg
  # A rerun reuses the finished models (their summary.json) and stops on the same one.
  with pytest.raises(SystemExit):
    mod.train_reward_models(str(tmp_path), [0.0, 0.3], 400, seed=1)
  assert len(calls) == 2
