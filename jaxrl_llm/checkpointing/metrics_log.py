"""Run metrics on disk: `<workdir>/metrics.jsonl` plus TensorBoard event files.

A resumed run first cuts metrics.jsonl back to the restored step (rows written
after the checkpoint by the killed process are dropped, and so is a partial
last line), and TensorBoard purges events past it, so both logs read as if
the run had never stopped.
"""

import json
import math
import os
from typing import Any, Mapping

import numpy as np

METRICS_FILE = "metrics.jsonl"
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


class MetricsWriter:
  """Appends one JSON row per step to metrics.jsonl and mirrors numbers to TensorBoard.

  resume_step: when resuming, the restored step; later rows are dropped first.
  enabled: False on non-primary hosts (they write nothing).
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None,
               tensorboard: bool = True, enabled: bool = True):
    self.path = os.path.join(workdir, METRICS_FILE)
    self.enabled = enabled
    self._f = self._tb = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    if resume_step is not None:
      truncate_metrics(self.path, resume_step)
    elif os.path.exists(self.path):
      os.remove(self.path)  # a fresh run in a reused workdir starts a fresh log
    self._f = open(self.path, "a")
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      purge = None if resume_step is None else resume_step + 1
      self._tb = SummaryWriter(os.path.join(workdir, TB_DIR), purge_step=purge)

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    row = {"step": int(step)}
    row.update({k: _plain(v) for k, v in metrics.items()})
    self._f.write(json.dumps(row) + "\n")
    self._f.flush()
    if self._tb is not None:
      for k, v in row.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) \
            and math.isfinite(v):
          self._tb.add_scalar(k, v, global_step=int(step))

  def close(self) -> None:
    if self._f is not None:
      self._f.close()
      self._f = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
