"""The step's metrics on the console: the progress bar, and the mean of a step's
update metrics. The files they are written to (metrics.jsonl, TensorBoard) are
jaxrl_llm/rundir/metrics.py's.
"""

from __future__ import annotations

import numpy as np

# (metrics key, column title, format) shown on the progress bar.
BAR_FIELDS = (("reward/mean", "reward", "{:.3f}"), ("reward/accuracy", "acc", "{:.3f}"),
              ("kl/ref", "kl", "{:.4f}"), ("entropy/mean", "ent", "{:.3f}"),
              ("trust/clip_frac", "clip", "{:.3f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}"))


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
