"""The report PNG: panels find their metrics, overlays work, bad input is named."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_llm.rundir import report_figure as report


def fake_run(workdir, seed, steps=40):
  rng = np.random.default_rng(seed)
  os.makedirs(workdir)
  f = open(os.path.join(workdir, "metrics.jsonl"), "w")
  for s in range(1, steps + 1):
    m = {"reward/mean": 0.3 + 0.5 * s / steps + 0.05 * rng.standard_normal(),
         "kl/ref": 0.001 * s, "entropy/mean": 1.5 - s / steps, "trust/clip_frac": 0.1,
         "correction/masked_frac": 0.02, "response/length_mean": 6.0 - s / 20,
         "time/step_s": 0.7}
    if s in (1, steps // 2, steps):
      m["eval/accuracy"] = 0.2 + 0.5 * s / steps
    f.write(json.dumps({"step": s, **m}) + "\n")
  f.close()


def test_smooth_is_a_trailing_mean():
  # window 2 over [1, 3, 5, 7]: [1, (1+3)/2, (3+5)/2, (5+7)/2] = [1, 2, 4, 6]
  np.testing.assert_allclose(report.smooth(np.array([1., 3., 5., 7.]), 2), [1, 2, 4, 6])


@pytest.mark.slow
def test_report_single_and_overlay(tmp_path):
  fake_run(tmp_path / "gspo", 0)
  fake_run(tmp_path / "grpo", 1)
  with open(tmp_path / "gspo" / "summary.json", "w") as f:
    json.dump({"eval_accuracy_start": 0.2, "eval_accuracy_end": 0.7}, f)
  out = report.write_report([str(tmp_path / "gspo")])
  assert out == os.path.join(tmp_path, "gspo", "report.png")
  assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  assert os.path.getsize(out) > 20_000  # six drawn panels, not an empty canvas
  proc = subprocess.run(
      [sys.executable, "-m", "jaxrl_llm.report", f"--workdir={tmp_path / 'gspo'}",
       f"--workdir={tmp_path / 'grpo'}"], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert os.path.exists(tmp_path / "compare.png")


def test_missing_metrics_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no metrics.jsonl in .*nowhere"):
    report.write_report([str(tmp_path / "nowhere")])
