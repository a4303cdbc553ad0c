"""Run metrics: one JSON line per step in <workdir>/metrics.jsonl, mirrored to
TensorBoard event files in <workdir>/tb, and the progress bar.

A resumed run first cuts metrics.jsonl back to the restored step (rows written
after the checkpoint by the killed process are dropped, and so is a partial
last line), and TensorBoard purges events past it, so both logs read as if
the run had never stopped.
"""

from __future__ import annotations

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


# (metrics key, column title, format) shown on the progress bar.
BAR_FIELDS = (("reward/mean", "reward", "{:.3f}"), ("reward/accuracy", "acc", "{:.3f}"),
              ("kl/ref", "kl", "{:.4f}"), ("entropy/mean", "ent", "{:.3f}"),
              ("trust/clip_frac", "clip", "{:.3f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}"))


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


def mean_over_updates(per_update: list[dict]) -> dict:
  """Averages update metrics over the step's updates (min/max for extrema)."""
  out = {}
  for k in per_update[0]:
    vals = np.asarray([float(np.asarray(m[k])) for m in per_update])
    out[k] = vals.min() if k.endswith("_min") else vals.max() if k.endswith("_max") else vals.mean()
  return out


def bar_text(metrics: dict) -> str:
  parts = []
  for key, title, fmt in BAR_FIELDS:
    if key in metrics:
      parts.append(f"{title} {fmt.format(float(metrics[key]))}")
  return " | ".join(parts)


class Progress:
  """A tqdm bar (or nothing when disabled)."""

  def __init__(self, total: int, enabled: bool, desc: str, initial: int = 0):
    self._bar = None
    if enabled:  # a resumed run starts the bar at its restored step
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

  def update(self, metrics: dict) -> None:
    if self._bar is not None:
      self._bar.set_postfix_str(bar_text(metrics), refresh=False)
      self._bar.update(1)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
