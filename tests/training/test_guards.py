"""training/guards.py's SignalGuard: warnings after `warn_after_steps` consecutive steps of a condition, a
stop after `stop_after_failed_steps` steps where every reward failed, and the same steps when a run is
resumed in the middle of such a streak (the counters replayed from the restored history)."""

import pytest

from jaxrl_llm.training.guards import GuardConfig, NoSignalError, SignalGuard

# Per step: (share of failed rewards, share of flat groups).
STEPS = [(0.0, 1.0), (0.0, 1.0), (0.6, 1.0), (0.7, 0.2), (1.0, 0.2), (1.0, 1.0), (0.0, 0.0), (0.8, 1.0), (0.9, 1.0)]


def _rows():
  return [{"signal/failure_rate": f, "signal/zero_adv_groups": z} for f, z in STEPS]


def _warnings(guard, rows, first_step=1):
  out = []
  for step, metrics in enumerate(rows, start=first_step):
    guard.update(step, metrics)
    out.append(metrics["signal/warning"])
  return out


def test_warnings_come_after_the_consecutive_steps_by_hand():
  cfg = GuardConfig(warn_after_steps=2, max_failure_rate=0.5, max_zero_adv_groups=0.95, stop_after_failed_steps=0)
  # flat: steps 1-3, 6, 8-9; failing (> 0.5): steps 3-6, 8-9. Two in a row warn from the second.
  assert _warnings(SignalGuard(cfg, lambda s: None), _rows()) == [0, 1, 1, 1, 1, 1, 0, 0, 1]


@pytest.mark.parametrize("resume_after", range(1, len(STEPS)))
def test_a_resumed_run_warns_at_the_same_steps(resume_after):
  cfg = GuardConfig(warn_after_steps=2, max_failure_rate=0.5, max_zero_adv_groups=0.95, stop_after_failed_steps=0)
  want = _warnings(SignalGuard(cfg, lambda s: None), _rows())
  before = _rows()[:resume_after]
  _warnings(SignalGuard(cfg, lambda s: None), before)
  resumed = SignalGuard(cfg, lambda s: None)
  resumed.replay(before)  # what the trainer does with the checkpoint's history
  assert _warnings(resumed, _rows()[resume_after:], first_step=resume_after + 1) == want[resume_after:]


def test_a_resume_inside_a_streak_of_failed_steps_stops_at_the_same_step():
  cfg = GuardConfig(warn_after_steps=3, stop_after_failed_steps=2)
  rows = [{"signal/failure_rate": 1.0, "signal/zero_adv_groups": 0.0}] * 3
  guard = SignalGuard(cfg, lambda s: None)
  guard.replay(rows[:1])
  with pytest.raises(NoSignalError, match=r"every sample for 2 steps in a row \(up to step 2\)"):
    guard.update(2, dict(rows[1]))
