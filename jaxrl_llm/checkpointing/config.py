"""Checkpoint settings: when to save, what to keep."""

import dataclasses

from jaxrl_llm.checks import bad, check_bool, check_choice, check_int


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Validated checkpoint settings (`config.checkpoint.*`; the run config's section is built from these defaults).

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
    check_int("config.checkpoint.every_steps", self.every_steps, 0)  # 0 saves only at the end
    check_int("config.checkpoint.keep_last", self.keep_last, 1)  # the latest checkpoint is needed to resume
    check_int("config.checkpoint.keep_best", self.keep_best, 0)
    check_choice("config.checkpoint.best_mode", self.best_mode, ("max", "min"))
    check_bool("config.checkpoint.async_save", self.async_save)
    if self.keep_best and not self.best_metric:
      raise bad("config.checkpoint.best_metric", self.best_metric,
                f"expected a metrics key when checkpoint.keep_best = {self.keep_best}")
