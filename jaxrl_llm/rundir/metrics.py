"""A run's metrics files: one JSON line per step in <workdir>/metrics.jsonl, mirrored to
TensorBoard event files in <workdir>/tb, and the end-of-run <workdir>/summary.json.

A resumed run first cuts metrics.jsonl back to the restored step (rows written
after the checkpoint by the killed process are dropped, and so is a partial
last line), and TensorBoard purges events past it, so both logs read as if
the run had never stopped. `load_run` reads both files back for the report
and the lab.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any, Mapping

import numpy as np

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
TB_DIR = "tb"


def _plain(v: Any) -> Any:
  """numpy / jax scalars -> Python numbers; other values unchanged."""
  if hasattr(v, "shape") and getattr(v, "shape", None) == ():
    v = np.asarray(v).item()
  elif isinstance(v, np.generic):
    v = v.item()
  return v


def read_metrics(path: str) -> list[dict]:
  """Rows of a metrics.jsonl file; a truncated last line is ignored."""
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rows.append(json.loads(line))
      except ValueError:
        break  # a line cut by a crash: nothing after it is trusted
  return rows


def truncate_metrics(path: str, step: int) -> int:
  """Keeps only rows with row["step"] <= step (atomic rewrite). Returns rows kept."""
  if not os.path.exists(path):
    return 0
  rows = [r for r in read_metrics(path) if r.get("step", -1) <= step]
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return len(rows)


class TensorBoardWriter:
  """Mirrors each metrics row's finite numbers to TensorBoard event files.

  Sits beside the metrics.jsonl writer (`MetricsWriter`).
  resume_step: when resuming, events after it (written by the killed process)
  are purged.
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None):
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    purge = None if resume_step is None else resume_step + 1
    # A unique file per writer: tensorboardX names files by the second, and a
    # quick restart would otherwise reopen (and truncate) the previous file.
    self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), purge_step=purge,
                             filename_suffix=f".{os.getpid()}.{time.time_ns()}")

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    for k, v in metrics.items():
      v = _plain(v)
      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        self._tb.add_scalar(k, v, global_step=int(step))
    self._tb.flush()

  def close(self) -> None:
    self._tb.close()


def _clean(v):
  v = float(np.asarray(v))
  return v if math.isfinite(v) else str(v)  # JSON has no inf/nan: keep them visible as strings


class MetricsWriter:
  """metrics.jsonl, mirrored to TensorBoard event files in <workdir>/tb.

  start_step: the step the run starts from (0, or the restored checkpoint's):
  rows after it, left by an earlier process of this workdir, are dropped.
  """

  def __init__(self, workdir: str, start_step: int = 0, tensorboard: bool = True):
    self.path = os.path.join(workdir, METRICS_FILE)
    truncate_metrics(self.path, start_step)
    self._f = open(self.path, "a", encoding="utf-8")
    self._tb = TensorBoardWriter(workdir, resume_step=start_step) if tensorboard else None

  def write(self, step: int, metrics: dict) -> None:
    row = {"step": int(step), **{k: _clean(v) for k, v in sorted(metrics.items())}}
    self._f.write(json.dumps(row) + "\n")
    self._f.flush()
    if self._tb is not None:
      self._tb.write(step, metrics)

  def close(self) -> None:
    self._f.close()
    if self._tb is not None:
      self._tb.close()


def write_summary(workdir: str, summary: dict) -> str:
  """<workdir>/summary.json, written when the run ends; -> its path."""
  path = os.path.join(workdir, SUMMARY_FILE)
  with open(path, "w") as f:
    json.dump(summary, f, indent=2)
  return path


def load_run(workdir: str) -> tuple[str, list[dict]]:
  """(the workdir's name, its metrics rows); summary.json, when the run wrote it, is one
  more row {"summary": ...} at the end."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"no {METRICS_FILE} in {workdir}: expected the workdir of a training run")
  rows = read_metrics(path)
  if not rows:
    raise ValueError(f"{path} holds no metrics rows yet")
  summary_path = os.path.join(workdir, SUMMARY_FILE)
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      rows.append({"summary": json.load(f)})
  return os.path.basename(os.path.normpath(workdir)), rows


def series(rows: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  """(steps, values) of the rows holding a finite `key`."""
  pts = [(r["step"], float(r[key])) for r in rows
         if "step" in r and isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
  if not pts:
    return np.zeros(0), np.zeros(0)
  s, v = zip(*pts)
  return np.asarray(s), np.asarray(v)
