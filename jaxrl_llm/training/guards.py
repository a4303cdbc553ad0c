"""Runs that learn nothing, said out loud: reward failures and zero-advantage groups.

A reward function that raises on every sample, or rewards that are equal
within every group, give zero advantages and a zero gradient: the run would
finish "successfully" having learned nothing. `SignalGuard` watches two
per-step figures the rollout stage logs:

    signal/failure_rate      share of samples whose reward function raised or timed out
    signal/zero_adv_groups   share of groups whose rewards are all equal (zero advantage)

When one stays above its threshold (`guard.max_failure_rate`,
`guard.max_zero_adv_groups`) for `guard.warn_after_steps` consecutive steps,
the console gets a warning and the step's metrics `signal/warning = 1`; when
every sample failed for `guard.stop_after_failed_steps` consecutive steps the
run stops with an error (its last checkpoint is kept).
"""

from __future__ import annotations

import dataclasses

from jaxrl_llm.checks import ConfigError, check_float, check_int


class NoSignalError(ConfigError):
  """The run gets no learning signal (a user's reward function or data, not a bug)."""


@dataclasses.dataclass(frozen=True)
class GuardConfig:
  """The run config's `guard` section; each field's comment is its documentation."""

  warn_after_steps: int = 3  # warn when a condition below holds this many RL steps in a row
  max_failure_rate: float = 0.5  # share of samples whose reward function raised or timed out
  max_zero_adv_groups: float = 0.95  # share of groups with equal rewards (zero advantage, no gradient)
  stop_after_failed_steps: int = 5  # stop with an error after this many steps where every reward failed; 0 never

  def __post_init__(self):
    check_int("config.guard.warn_after_steps", self.warn_after_steps, 1)
    check_float("config.guard.max_failure_rate", self.max_failure_rate, 0.0, 1.0)
    check_float("config.guard.max_zero_adv_groups", self.max_zero_adv_groups, 0.0, 1.0)
    check_int("config.guard.stop_after_failed_steps", self.stop_after_failed_steps, 0)


class SignalGuard:
  def __init__(self, cfg: GuardConfig, log):
    self.cfg, self.log = cfg, log
    self.failing = self.flat = self.all_failed = 0  # consecutive steps of each condition

  def replay(self, history) -> None:
    """The counters after a resumed run's earlier steps (their metrics rows, in order), as the
    uninterrupted run has them: a resume warns and stops at the same steps."""
    for metrics in history:
      self._count(metrics)

  def _count(self, metrics: dict) -> tuple[float, float]:
    c = self.cfg
    fail, flat = float(metrics["signal/failure_rate"]), float(metrics["signal/zero_adv_groups"])
    self.failing = self.failing + 1 if fail > c.max_failure_rate else 0
    self.flat = self.flat + 1 if flat > c.max_zero_adv_groups else 0
    self.all_failed = self.all_failed + 1 if fail >= 1.0 else 0
    return fail, flat

  def update(self, step: int, metrics: dict) -> None:
    """Counts the step's conditions; warns (console and metrics['signal/warning']) or stops."""
    c = self.cfg
    fail, flat = self._count(metrics)
    if c.stop_after_failed_steps and self.all_failed >= c.stop_after_failed_steps:
      raise NoSignalError(f"the reward function failed (raised or timed out) on every sample for "
                          f"{self.all_failed} steps in a row (up to step {step}): the run learns nothing. Check "
                          f"the reward function and the data's answers (config.guard.stop_after_failed_steps="
                          f"{c.stop_after_failed_steps}; 0 never stops)")
    warned = False
    if self.failing >= c.warn_after_steps:
      self.log(f"warning: step {step}: the reward function failed on {fail:.0%} of the samples, above "
               f"config.guard.max_failure_rate={c.max_failure_rate}, for {self.failing} steps")
      warned = True
    if self.flat >= c.warn_after_steps:
      self.log(f"warning: step {step}: {flat:.0%} of the groups have equal rewards (zero advantage, no gradient), "
               f"above config.guard.max_zero_adv_groups={c.max_zero_adv_groups}, for {self.flat} steps")
      warned = True
    metrics["signal/warning"] = float(warned)
