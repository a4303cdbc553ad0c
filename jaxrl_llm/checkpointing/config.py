"""Checkpoint settings: when to save, what to keep."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Validated checkpoint settings (`config.checkpoint.*` in configs/base.py).

  Attributes:
    every_steps: save every this many RL steps (0: only at the end of the run).
    keep_last: number of most recent checkpoints kept (>= 1, so resume works).
    keep_best: number of best checkpoints by `best_metric` also kept (0: off).
    best_metric: metrics key ranking checkpoints, e.g. "eval/accuracy"; steps
      saved without it are ranked by recency only.
    best_mode: "max" or "min": whether a larger best_metric is better.
    async_save: write in a background thread while training continues.
  """

  every_steps: int = 50
  keep_last: int = 3
  keep_best: int = 0
  best_metric: str = "eval/accuracy"
  best_mode: str = "max"
  async_save: bool = True

  def __post_init__(self):
    if not isinstance(self.every_steps, int) or self.every_steps < 0:
      raise ValueError(
          f"checkpoint.every_steps = {self.every_steps!r}: expected an integer >= 0"
          " (0 saves only at the end)")
    if not isinstance(self.keep_last, int) or self.keep_last < 1:
      raise ValueError(
          f"checkpoint.keep_last = {self.keep_last!r}: expected an integer >= 1"
          " (the latest checkpoint is needed to resume)")
    if not isinstance(self.keep_best, int) or self.keep_best < 0:
      raise ValueError(
          f"checkpoint.keep_best = {self.keep_best!r}: expected an integer >= 0")
    if self.best_mode not in ("max", "min"):
      raise ValueError(
          f"checkpoint.best_mode = {self.best_mode!r}: expected 'max' or 'min'")
    if self.keep_best and not self.best_metric:
      raise ValueError(
          "checkpoint.best_metric is empty: expected a metrics key when "
          f"checkpoint.keep_best = {self.keep_best}")
