"""Run metrics on disk: reading and cutting back `<workdir>/metrics.jsonl`,
and the TensorBoard event files beside it.

A resumed run first cuts metrics.jsonl back to the restored step (rows written
after the checkpoint by the killed process are dropped, and so is a partial
last line), and TensorBoard purges events past it, so both logs read as if
the run had never stopped.
"""

import json
import math
import os
import time
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


class TensorBoardWriter:
  """Mirrors each metrics row's finite numbers to TensorBoard event files.

  Sits beside the trainer's metrics.jsonl writer (training/metrics.py).
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
