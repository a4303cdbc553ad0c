"""scripts/same_run.py: two runs' metrics compared step by step, on hand-written workdirs."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "same_run.py")


def _workdir(path, rows, summary=None):
  path.mkdir()
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  if summary is not None:
    (path / "summary.json").write_text(json.dumps(summary))
  return str(path)


def test_equal_and_differing_metrics_and_the_accuracy_curves(tmp_path):
  a = _workdir(tmp_path / "a", [
      {"step": 1, "loss/total": 0.5, "ratio/c_max": 1.0, "time/step_s": 3.0},
      {"step": 2, "loss/total": 0.25, "ratio/c_max": 1.5, "eval/accuracy": 0.5, "time/step_s": 2.0}],
      {"eval_accuracy_start": 0.25, "eval_accuracy_end": 0.5})
  b = _workdir(tmp_path / "b", [
      {"step": 1, "loss/total": 0.5, "ratio/c_max": 1.25, "time/step_s": 9.0},
      {"step": 2, "loss/total": 0.25, "ratio/c_max": 1.0, "eval/accuracy": 0.5, "time/step_s": 1.0,
       "mismatch/extra": 1.0}],
      {"eval_accuracy_start": 0.25, "eval_accuracy_end": 0.5})
  out = tmp_path / "out.json"
  res = subprocess.run([sys.executable, SCRIPT, a, b, "--out", str(out)], capture_output=True, text=True,
                       timeout=60)
  assert res.returncode == 0, res.stderr
  got = json.loads(out.read_text())
  assert got["steps"] == [[1, 2], [1, 2]]
  # the clock fields are left out; loss/total and eval/accuracy equal at every step
  assert got["equal"] == ["eval/accuracy", "loss/total"]
  # ratio/c_max: |1 - 1.25| at step 1, |1.5 - 1| at step 2
  assert got["differ"] == {"ratio/c_max": {"max_abs": 0.5, "first_step": 1}}
  assert got["only_a"] == [] and got["only_b"] == ["mismatch/extra"]
  assert got["accuracy"][0] == got["accuracy"][1] == {"start": 0.25, "2": 0.5, "end": 0.5}
  assert "differ: 1" in res.stdout and "ratio/c_max: max |a - b| 0.5, first at step 1" in res.stdout


def test_a_directory_without_metrics_is_one_line_and_status_2(tmp_path):
  a = _workdir(tmp_path / "a", [{"step": 1}])
  res = subprocess.run([sys.executable, SCRIPT, a, str(tmp_path / "nothing")], capture_output=True, text=True,
                       timeout=60)
  assert res.returncode == 2 and res.stdout == ""
  assert res.stderr.strip() == f"error: {tmp_path / 'nothing'}: no metrics.jsonl (a workdir of python -m jaxrl_llm.train)"
