"""Metrics: one JSON line per step in <workdir>/metrics.jsonl, and the
progress bar."""

from __future__ import annotations

import json
import math
import os

import numpy as np

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
    from jaxrl_llm.checkpointing.metrics_log import TensorBoardWriter, truncate_metrics

    self.path = os.path.join(workdir, "metrics.jsonl")
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

  def __init__(self, total: int, enabled: bool, desc: str):
    self._bar = None
    if enabled:
      from tqdm.auto import tqdm
      self._bar = tqdm(total=total, desc=desc, dynamic_ncols=True)

  def update(self, metrics: dict) -> None:
    if self._bar is not None:
      self._bar.set_postfix_str(bar_text(metrics), refresh=False)
      self._bar.update(1)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
