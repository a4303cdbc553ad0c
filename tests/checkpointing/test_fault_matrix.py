"""The reliability matrix's bitwise-resume rows, in a smaller form (scripts/fault_matrix.py runs them all):
SIGKILL in a rollout and SIGTERM in an update, each followed by a rerun of the same command, end with
the uninterrupted run's final params and metrics, bit for bit."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_kill_and_sigterm_rows_lose_nothing(tmp_path):
  out = tmp_path / "rows.json"
  proc = subprocess.run([sys.executable, "scripts/fault_matrix.py", "--out", str(out),
                         "--rows", "kill_rollout_5,sigterm"], cwd=REPO, capture_output=True, text=True, timeout=900)
  rows = json.load(open(out))["rows"]
  assert [r["row"] for r in rows] == ["kill_rollout_5", "sigterm"], proc.stderr[-2000:]
  for r in rows:
    assert not r["lost"] and r["check"] == "final params and metrics bitwise equal", r
  assert rows[0]["run"].startswith("killed (rc -9); rerun rc 0")
  assert rows[1]["run"].startswith("rc 143") and "rerun rc 0" in rows[1]["run"]
  assert proc.returncode == 0


@pytest.mark.slow
def test_kills_with_the_asynchronous_state_in_flight_lose_nothing(tmp_path):
  """SIGKILL with batches queued by the background generation (overlap, staleness 2) and samples in the
  continuous batcher's slots, and with multi-turn episodes and their tool workers mid-way: each rerun
  resumes from a checkpoint and ends with its own uninterrupted run's params and metrics, bit for bit."""
  out = tmp_path / "rows.json"
  # (the matrix's third such row, async_kill_update_5, kills the same run in an update: the script runs it)
  proc = subprocess.run([sys.executable, "scripts/fault_matrix.py", "--out", str(out), "--rows",
                         "async_kill_decode_chunk,episodes"], cwd=REPO, capture_output=True, text=True, timeout=1500)
  rows = json.load(open(out))["rows"]
  assert [r["row"] for r in rows] == ["async_kill_decode_chunk_22", "episodes_kill_episode_round_5"], \
      proc.stderr[-2000:]
  for r in rows:
    assert r["run"] == "killed (rc -9); rerun rc 0, resumed from a checkpoint", r
    assert not r["lost"] and r["check"] == "final params and metrics bitwise equal", r
  assert proc.returncode == 0
